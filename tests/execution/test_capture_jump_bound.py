"""A jump over output that cleans to (almost) nothing reads a bounded tail, never the whole
gap (before: 64 MiB of NULs after one line made the daemon read all 64 MiB in one piece)."""

import trio

from dshd.execution import capture as c


def test_a_jump_over_output_that_cleans_away_reads_a_bounded_tail():
    data = b"hello\n" + b"\0" * (64 << 20)
    reads: list[int] = []

    async def reader(offset: int, n: int) -> bytes:
        reads.append(n)
        return data[offset:offset + n]

    async def main() -> c.OutputCapture:
        cap = c.OutputCapture(c.ShellOutputLimits(max_bytes=51200, max_lines=2000, retain="tail"))
        await c.catch_up(cap, reader, len(data), 0, 1)
        return cap

    cap = trio.run(main)
    assert max(reads) <= c.JUMP_MAX, max(reads)
    assert cap.text == ""  # the bounded tail holds only NULs: nothing to show
    assert cap.truncation["totalBytes"] == len(data)

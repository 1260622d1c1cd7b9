// ansi.js: a call's output bytes as styled spans (SGR colours), incrementally.
//
// Theory of operation: an AnsiView owns one container element. write(bytes) decodes UTF-8 in
// streaming mode (a character split across chunks is kept for the next one), then walks the
// text: plain runs become text in a <span> carrying the current style's classes (ansi-fg-N,
// ansi-bg-N, ansi-bold, ...) or inline colour for 256/true colours; SGR sequences (ESC [ ... m)
// change the style; every other escape sequence (cursor moves, OSC titles, charset selects) is
// dropped, and so are C0 controls but newline, tab and carriage return; a carriage return
// (not before a newline) erases the last line, as the next text overwrites it in a
// terminal, so a prompt redrawn in place shows once. An escape
// split across chunks waits in `pending` (bounded: a sequence longer than 256 characters is
// dropped). The container keeps at most `maxChars` characters and `maxLines` lines (2,000):
// the oldest text goes first, so
// a call that prints gigabytes cannot exhaust the page (the complete output stays in dshd:
// tool.read). textContent of the container is the output with the escapes stripped.
// Writes are coalesced: bytes queue (at most maxQueued) and reach the DOM at the next
// animation frame, one update per frame however many chunks came, so a flood costs the page
// a bounded amount of work. The box sticks to its bottom (the latest lines) until the person
// scrolls up, and follows again once they scroll back to the bottom.

const ESC = "\x1b";
const MAX_PENDING = 256;
const PALETTE_256 = buildPalette();

function buildPalette() {
  const base = ["#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
    "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff"];
  const out = base.slice();
  const steps = [0, 95, 135, 175, 215, 255];
  for (let r = 0; r < 6; r++) for (let g = 0; g < 6; g++) for (let b = 0; b < 6; b++) {
    out.push(`rgb(${steps[r]},${steps[g]},${steps[b]})`);
  }
  for (let i = 0; i < 24; i++) {
    const v = 8 + i * 10;
    out.push(`rgb(${v},${v},${v})`);
  }
  return out;
}

function freshStyle() {
  return { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false };
}

/** Apply one SGR parameter list (numbers) to `style` (modified in place). */
export function applySgr(style, params) {
  if (params.length === 0) params = [0];
  for (let i = 0; i < params.length; i++) {
    const p = params[i];
    if (p === 0) Object.assign(style, freshStyle());
    else if (p === 1) style.bold = true;
    else if (p === 2) style.dim = true;
    else if (p === 3) style.italic = true;
    else if (p === 4) style.underline = true;
    else if (p === 7) style.inverse = true;
    else if (p === 22) style.bold = style.dim = false;
    else if (p === 23) style.italic = false;
    else if (p === 24) style.underline = false;
    else if (p === 27) style.inverse = false;
    else if (p >= 30 && p <= 37) style.fg = p - 30;
    else if (p >= 90 && p <= 97) style.fg = p - 90 + 8;
    else if (p === 39) style.fg = null;
    else if (p >= 40 && p <= 47) style.bg = p - 40;
    else if (p >= 100 && p <= 107) style.bg = p - 100 + 8;
    else if (p === 49) style.bg = null;
    else if (p === 38 || p === 48) {
      const key = p === 38 ? "fg" : "bg";
      if (params[i + 1] === 5 && i + 2 < params.length) {
        style[key] = params[i + 2] & 255;
        i += 2;
      } else if (params[i + 1] === 2 && i + 4 < params.length) {
        const [r, g, b] = params.slice(i + 2, i + 5).map((v) => Math.max(0, Math.min(255, v)));
        style[key] = `rgb(${r},${g},${b})`;
        i += 4;
      }
    }
  }
  return style;
}

function styleKey(s) {
  return `${s.fg}|${s.bg}|${s.bold}|${s.dim}|${s.italic}|${s.underline}|${s.inverse}`;
}

function decorate(span, s) {
  const classes = [];
  const [fg, bg] = s.inverse ? [s.bg ?? 0, s.fg ?? 7] : [s.fg, s.bg];
  for (const [name, value] of [["fg", fg], ["bg", bg]]) {
    if (value === null) continue;
    if (typeof value === "number" && value < 16) classes.push(`ansi-${name}-${value}`);
    else span.style[name === "fg" ? "color" : "backgroundColor"] =
      typeof value === "number" ? PALETTE_256[value] : value;
  }
  if (s.bold) classes.push("ansi-bold");
  if (s.dim) classes.push("ansi-dim");
  if (s.italic) classes.push("ansi-italic");
  if (s.underline) classes.push("ansi-underline");
  if (classes.length) span.className = classes.join(" ");
}

/** Split text into [{text, style}] runs and the unfinished escape at its end. Pure. */
export function parseAnsi(text, style) {
  const runs = [];
  let plain = "";
  const flush = () => {
    if (plain) runs.push({ text: plain, style: { ...style } });
    plain = "";
  };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === ESC) {
      const end = escapeEnd(text, i);
      if (end < 0) {
        flush();
        const rest = text.slice(i);
        return { runs, pending: rest.length > MAX_PENDING ? "" : rest };
      }
      const seq = text.slice(i, end);
      if (/^\x1b\[[0-9;:]*m$/.test(seq)) {
        flush();
        const params = seq.slice(2, -1).split(/[;:]/).filter((x) => x !== "").map(Number);
        applySgr(style, params);
      }
      i = end;
      continue;
    }
    if (ch === "\r") {
      // A return to the line's start: what follows overwrites the line (a {cr} run), as in a
      // terminal; "\r\n" is a newline. A "\r" at the end waits for the next chunk.
      if (i + 1 >= text.length) {
        flush();
        return { runs, pending: "\r" };
      }
      if (text[i + 1] !== "\n" && text[i + 1] !== "\r") {
        flush();
        runs.push({ cr: true });
      }
      i++;
      continue;
    }
    const code = ch.charCodeAt(0);
    if (ch === "\n" || ch === "\t" || code >= 0x20) plain += ch === "\x7f" ? "" : ch;
    i++;
  }
  flush();
  return { runs, pending: "" };
}

/** The index after the escape sequence that starts at `i`, or -1 when it is unfinished. */
function escapeEnd(text, i) {
  if (i + 1 >= text.length) return -1;
  const kind = text[i + 1];
  if (kind === "[") {
    for (let j = i + 2; j < text.length; j++) {
      const c = text.charCodeAt(j);
      if (c >= 0x40 && c <= 0x7e) return j + 1;
    }
    return -1;
  }
  if (kind === "]" || kind === "P" || kind === "_" || kind === "^") {
    for (let j = i + 2; j < text.length; j++) {
      if (text[j] === "\x07") return j + 1;
      if (text[j] === ESC && text[j + 1] === "\\") return j + 2;
    }
    return -1;
  }
  if (kind === "(" || kind === ")" || kind === "#") return i + 3 <= text.length ? i + 3 : -1;
  return i + 2;
}

export class AnsiView {
  constructor(container, { maxChars = 262144, maxLines = 2000, maxQueued = 1048576 } = {}) {
    this.container = container;
    this.maxChars = maxChars;
    this.maxLines = maxLines;
    this.lines = 0;
    this.maxQueued = maxQueued;
    this.chars = 0;
    this.style = freshStyle();
    this.pending = "";
    this.decoder = new TextDecoder("utf-8");
    this.queue = [];
    this.queued = 0;
    this.scheduled = false;
    this.stick = true; // follow the bottom until the person scrolls up
    container.addEventListener("scroll", () => {
      this.stick = container.scrollTop + container.clientHeight >= container.scrollHeight - 8;
    });
  }

  /** Queue bytes; they reach the DOM at the next animation frame (one update per frame, however
   * many chunks arrived). At most maxQueued bytes wait: older queued bytes are dropped. */
  write(bytes) {
    this.queue.push(bytes);
    this.queued += bytes.length;
    while (this.queued > this.maxQueued && this.queue.length > 1) this.queued -= this.queue.shift().length;
    if (this.scheduled) return;
    this.scheduled = true;
    const flush = () => { if (this.scheduled) this.flush(); };
    if (typeof requestAnimationFrame === "function") requestAnimationFrame(flush);
    setTimeout(flush, 250); // a hidden tab gets no frames: flush anyway
  }

  /** Drop what waits for the next frame (the caller skips ahead). */
  discardQueued() {
    this.queue = [];
    this.queued = 0;
  }

  flush() {
    this.scheduled = false;
    const chunks = this.queue;
    this.discardQueued();
    let text = this.pending;
    for (const bytes of chunks) text += this.decoder.decode(bytes, { stream: true });
    const { runs, pending } = parseAnsi(text, this.style);
    this.pending = pending;
    const frag = document.createDocumentFragment();
    let tail = this.container.lastElementChild;
    let lastKey = tail ? tail.dataset.style : null;
    for (const run of runs) {
      if (run.cr) {
        this.container.append(frag);
        this.eraseLine();
        tail = this.container.lastElementChild;
        lastKey = tail ? tail.dataset.style : null;
        continue;
      }
      const key = styleKey(run.style);
      if (lastKey === key && tail) {
        tail.append(run.text);
      } else {
        tail = document.createElement("span");
        tail.dataset.style = key;
        decorate(tail, run.style);
        tail.textContent = run.text;
        frag.append(tail);
        lastKey = key;
      }
      this.chars += run.text.length;
      this.lines += newlines(run.text);
    }
    this.container.append(frag);
    this.trim();
    if (this.stick) this.toBottom();
  }

  /** Remove the last line's text (back to the last newline): a "\r" came. */
  eraseLine() {
    for (let span = this.container.lastElementChild; span; ) {
      const text = span.textContent;
      const nl = text.lastIndexOf("\n");
      const prev = span.previousElementSibling;
      if (nl >= 0) {
        this.chars -= text.length - nl - 1;
        span.textContent = text.slice(0, nl + 1);
        return;
      }
      this.chars -= text.length;
      span.remove();
      span = prev;
    }
  }

  toBottom() {
    this.container.scrollTop = this.container.scrollHeight;
  }

  /** Keep at most maxChars characters and maxLines lines: the oldest text goes first (a long
   * window would make every layout, hence every frame, slow). */
  trim() {
    while ((this.chars > this.maxChars || this.lines > this.maxLines) && this.container.firstElementChild) {
      const first = this.container.firstElementChild;
      const text = first.textContent;
      let cut = Math.max(0, this.chars - this.maxChars);
      for (let extra = this.lines - this.maxLines, at = 0; extra > 0; extra--) {
        at = text.indexOf("\n", at);
        if (at < 0) { cut = text.length; break; }
        at++;
        cut = Math.max(cut, at);
      }
      if (cut <= 0) break;
      if (cut >= text.length) {
        first.remove();
        cut = text.length;
      } else {
        first.textContent = text.slice(cut);
      }
      this.chars -= cut;
      this.lines -= newlines(text.slice(0, cut));
    }
  }

  clear() {
    this.discardQueued();
    this.container.replaceChildren();
    this.chars = 0;
    this.lines = 0;
    this.style = freshStyle();
    this.pending = "";
    this.decoder = new TextDecoder("utf-8");
  }
}

function newlines(text) {
  let n = 0;
  for (let at = text.indexOf("\n"); at >= 0; at = text.indexOf("\n", at + 1)) n++;
  return n;
}

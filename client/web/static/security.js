// security.js: the page's half of the bridge's security model (docs/WEB.md "Security model").
//
// Theory of operation: the bridge's cookie reaches every port of 127.0.0.1, so a server on
// another loopback port could read it; the WebSocket therefore also needs the token itself,
// which only this origin holds. The token exchange (`/?token=T`) answers 303 to `/#token=T`:
// a fragment never reaches a server or a Referer. takeToken() removes it from the address bar
// at once (history.replaceState, keeping the rest of the fragment: #session=ID) and moves it
// into localStorage (per origin: scheme, host AND port, so another port cannot read it) only
// when the bridge confirms it came from its exchange: `POST /signin` with the token in
// `X-Dsh-Token` answers 204 when the exchange's one-time, HttpOnly marker cookie is there,
// unspent, and the token is right. Any page can send a browser to `/#token=JUNK`; such a
// fragment is dropped and the good token kept (no sign-out by a link). tokenProtocols() is what RpcConnection offers each time it connects:
// ["dsh.v1", "dsh.token." + token] (token_urlsafe characters are valid subprotocol tokens);
// the bridge answers "dsh.v1", never the token. signedOut() tells a refused WebSocket of a
// stale or absent sign-in (no token stored, or `HEAD /` answers 401: the cookie is gone or
// belongs to an older token) from a bridge that is away. safeLinkHandler is the terminal's
// OSC 8 link handler: it opens only http(s) URLs, in a new tab without opener or referrer.
//
// Pure except for the storage, history and fetch it is given (defaults: the browser's).

export const TOKEN_KEY = "dsh-web-token";
export const SUBPROTOCOL = "dsh.v1";
export const TOKEN_PREFIX = "dsh.token.";
export const SIGNED_OUT = "signed out: open the URL dsh web printed";

/** What the banner says when signed out: what to open, and where to find it. */
export function signInHelp(origin = globalThis.location?.origin ?? "http://127.0.0.1:8470") {
  return `Signed out: this page holds no valid sign-in, so it has stopped trying. Open the URL ` +
    `\`dsh web\` printed, ${origin}/?token=… (run \`dsh web\` again to see it: it keeps its ` +
    `token), in this tab or another; this page connects again once you come back to it.`;
}
const TOKEN_RE = /^[A-Za-z0-9_-]{16,512}$/;

let memoryToken = null; // where storage is unavailable (a browser that refuses localStorage)

function storage() {
  try {
    return globalThis.localStorage ?? null;
  } catch {
    return null; // access itself can throw (storage disabled)
  }
}

/** Split a fragment ("#a=1&token=T") into the token and the rest ("#a=1", or ""). */
export function splitFragment(hash) {
  const parts = (hash || "").replace(/^#/, "").split("&").filter(Boolean);
  let token = null;
  const rest = [];
  for (const p of parts) {
    if (p.startsWith("token=")) token = decodeURIComponent(p.slice(6));
    else rest.push(p);
  }
  return { token, rest: rest.length ? `#${rest.join("&")}` : "" };
}

/** Whether the bridge says `token` came from its token exchange just now (POST /signin: 204). */
export async function fromExchange(token, fetchFn = globalThis.fetch) {
  try {
    const res = await fetchFn("/signin", { method: "POST", cache: "no-store", credentials: "same-origin",
      headers: { "X-Dsh-Token": token } });
    return res.status === 204;
  } catch {
    return false;
  }
}

/** Take a token from the address bar's fragment: always off the address bar, into storage
 * only when the bridge confirms the exchange handed it out. Resolves to whether it was stored. */
export async function takeToken(loc = globalThis.location, hist = globalThis.history, store = storage(),
  fetchFn = globalThis.fetch) {
  const { token, rest } = splitFragment(loc.hash);
  if (token === null) return false;
  hist.replaceState(null, "", `${loc.pathname}${loc.search}${rest}`);
  if (!TOKEN_RE.test(token)) return false;
  if (!(await fromExchange(token, fetchFn))) return false; // a foreign page's fragment
  memoryToken = token;
  try {
    store?.setItem(TOKEN_KEY, token);
  } catch {
    // storage full or refused: the token stays in memory for this page
  }
  return true;
}

/** The stored token, or null. */
export function readToken(store = storage()) {
  try {
    const token = store?.getItem(TOKEN_KEY);
    if (token && TOKEN_RE.test(token)) return token;
  } catch {
    // storage refused
  }
  return memoryToken;
}

/** The WebSocket subprotocols that prove the page holds the token. */
export function tokenProtocols(token = readToken()) {
  return token ? [SUBPROTOCOL, TOKEN_PREFIX + token] : [SUBPROTOCOL];
}

/** Whether a refused WebSocket means "signed out" (true) rather than "the bridge is away". */
export async function signedOut({ token = readToken(), fetchFn = globalThis.fetch } = {}) {
  if (!token) return true;
  try {
    const res = await fetchFn("/", { method: "HEAD", cache: "no-store", credentials: "same-origin" });
    return res.status === 401;
  } catch {
    return false; // the bridge does not answer at all: it is away, not a sign-in matter
  }
}

/** Whether an OSC 8 link may be opened: http and https only. */
export function linkAllowed(uri) {
  try {
    const url = new URL(uri);
    return url.protocol === "http:" || url.protocol === "https:";
  } catch {
    return false;
  }
}

/** xterm's ILinkHandler: opens http(s) links only, without opener and referrer. */
export function safeLinkHandler(open = (...args) => globalThis.open(...args)) {
  return {
    allowNonHttpProtocols: false,
    activate(event, uri) {
      event?.preventDefault?.();
      if (linkAllowed(uri)) open(uri, "_blank", "noopener,noreferrer");
    },
  };
}

// dom.js: the page's one DOM helper. el(tag, attrs, ...children) builds an element: attrs
// "testid" becomes data-testid, "data" an object of data-* attributes, "on" an object of event
// listeners, "class"/"text"/anything else set as attributes or properties. No framework: the
// page's views keep their elements in Maps keyed by call or approval id and update them in
// place, so typing in a box or a terminal is never disturbed by a re-render.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "testid") node.dataset.testid = value;
    else if (key === "data") Object.assign(node.dataset, value);
    else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Replace a node's children (a small list re-render). */
export function setChildren(node, children) {
  node.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}

/** Keep `container`'s keyed children equal to `keys` in order: make() for new keys, update()
 * for every key, remove the rest. `cache` is a Map key -> element owned by the caller. */
export function reconcile(container, cache, keys, make, update) {
  const wanted = new Set(keys);
  for (const [key, node] of cache) {
    if (!wanted.has(key)) {
      node.remove();
      cache.delete(key);
    }
  }
  keys.forEach((key, index) => {
    let node = cache.get(key);
    if (!node) {
      node = make(key);
      cache.set(key, node);
    }
    update(key, node);
    const at = container.children[index] ?? null;
    if (at !== node) container.insertBefore(node, at);
  });
}

/** A short, readable age ("12 s", "3 min", "2 h", "4 d") of a time in ms. */
export function age(ms, now = Date.now()) {
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

// Characters that change how the text around them reads without being seen: bidi embeddings,
// overrides and isolates, marks, zero-width ones, the line and paragraph separators, the Hangul
// fillers (they render blank), and controls other than newline and tab: the same set as the
// TUI's client/tui/ansi.py visible_text.
const INVISIBLE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u115f\u1160\u200b-\u200f\u2028-\u202e\u2060-\u2069\u3164\ufeff\uffa0]/g;

/** `text` with every invisible or reordering character shown as a `\uXXXX` escape: what a
 * person approves must read as what runs (a U+202E override can make `; touch x # ohce` read
 * as an `echo`). Newlines and tabs stay. */
export function visibleText(text) {
  return String(text).replace(INVISIBLE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** The command of a bash call's lane `args` (an object, or a cut JSON string), made visible. */
export function commandOf(args) {
  if (args && typeof args === "object") return visibleText(args.command ?? JSON.stringify(args));
  if (typeof args === "string") {
    const m = /"command"\s*:\s*"((?:[^"\\]|\\.)*)/.exec(args);
    return visibleText(m ? m[1].replace(/\\n/g, "\n").replace(/\\"/g, '"') + "…" : args);
  }
  return "";
}

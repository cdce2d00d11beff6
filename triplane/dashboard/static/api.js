// The REST API and the event stream, with the token kept in sessionStorage.
// The token travels in the Authorization header only: never in a URL, never logged.
// The stream is read with fetch() and a ReadableStream (EventSource cannot send a header),
// and resumed after a drop with Last-Event-ID, so no event is lost or seen twice.

const KEY = "triplane.token";

export function token() { return sessionStorage.getItem(KEY); }
export function setToken(t) { sessionStorage.setItem(KEY, t); }
export function forget() { sessionStorage.removeItem(KEY); }

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.kind = e.kind || "http";
    this.detail = e;
  }
}

let onUnauthorized = () => {};
export function whenUnauthorized(fn) { onUnauthorized = fn; }

export async function call(method, path, params) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v === undefined || v === null) continue;
    for (const one of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(one));
  }
  const r = await fetch(url, { method, headers: { Authorization: `Bearer ${token()}`, Accept: "application/json" },
                               cache: "no-store", credentials: "omit" });
  let body = null;
  const text = await r.text();
  if (text) { try { body = JSON.parse(text); } catch { body = null; } }
  if (r.status === 401) onUnauthorized();
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

export const get = (path, params) => call("GET", path, params);
export const post = (path, params) => call("POST", path, params);

/** Every item of a paged list, following `next` (bounded: `max` items). */
export async function all(path, params, max = 5000) {
  const items = [];
  let cursor = null;
  do {
    const page = await get(path, { ...params, limit: 1000, cursor });
    items.push(...page.items);
    cursor = page.next;
  } while (cursor && items.length < max);
  return items;
}

/**
 * The live event stream. `onEvent(event)` for each event, `onState(state)` with
 * "connecting", "live" or "offline" (then it retries, backing off to 10 s).
 * Returns a function that stops it.
 */
export function stream(onEvent, onState, params = {}) {
  let lastId = null;
  let stopped = false;
  let ctrl = null;
  let delay = 500;

  async function once() {
    ctrl = new AbortController();
    const url = new URL("/v1/events", location.origin);
    for (const [k, v] of Object.entries(params)) url.searchParams.append(k, v);
    const headers = { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" };
    if (lastId !== null) headers["Last-Event-ID"] = String(lastId);
    onState("connecting");
    const r = await fetch(url, { headers, signal: ctrl.signal, cache: "no-store", credentials: "omit" });
    if (r.status === 401) { onUnauthorized(); throw new ApiError(401, null); }
    if (!r.ok || !r.body) throw new ApiError(r.status, null);
    onState("live");
    delay = 500;
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const frame = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let id = null, data = "";
        for (const line of frame.split("\n")) {
          if (line.startsWith("id: ")) id = Number(line.slice(4));
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (!data) continue;  // a comment (keep-alive)
        if (id !== null) lastId = id;
        try { onEvent(JSON.parse(data)); } catch (e) { console.error("event handler failed", e); }
      }
    }
  }

  (async () => {
    while (!stopped) {
      try { await once(); } catch (e) { if (stopped) return; }
      if (stopped) return;
      onState("offline");
      await new Promise((res) => setTimeout(res, delay));
      delay = Math.min(delay * 2, 10000);
    }
  })();
  return () => { stopped = true; if (ctrl) ctrl.abort(); };
}

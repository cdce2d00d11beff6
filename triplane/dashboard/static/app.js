// The shell: sign-in, the router (#/overview, #/job/<id>, #/network, #/storage, #/ops), the
// connection state, and the one event stream whose events go to the page on show.
import * as api from "./api.js";
import { clear, errorBox } from "./util.js";
import { overview } from "./overview.js";
import { jobPage } from "./job.js";
import { network, storage, ops } from "./pages.js";

const PAGES = { overview, network, storage, ops };
const main = document.getElementById("main");
const conn = document.getElementById("conn");
let current = null;
let me = null;
let stopStream = null;

// Render-time figures the benchmark and tests read (milliseconds, measured with performance.now()).
window.__tp = { renders: [], events: 0, connected: 0 };

function setConn(state) {
  conn.dataset.state = state;
  conn.textContent = state === "live" ? "live" : state === "connecting" ? "connecting…" : "offline, retrying";
  if (state === "live") window.__tp.connected++;
}

function ask(message) {
  const dlg = document.getElementById("login");
  const input = document.getElementById("token-input");
  document.getElementById("login-error").textContent = message || "";
  input.value = "";
  if (!dlg.open) dlg.showModal();
  input.focus();
}

async function signIn() {
  try {
    me = await api.get("/v1/whoami");
  } catch (e) {
    if (e.status === 401) { api.forget(); ask("That token was not accepted."); return false; }
    clear(main).append(errorBox(e));
    return false;
  }
  document.getElementById("who").textContent = `${me.name} (${me.role})`;
  return true;
}

function route() {
  if (current && current.stop) current.stop();
  current = null;
  const hash = location.hash.replace(/^#\/?/, "") || "overview";
  const [name, ...rest] = hash.split("/");
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  clear(main);
  const ctx = { role: me.role, name: me.name };
  if (name === "job" && rest.length) current = jobPage(main, decodeURIComponent(rest.join("/")), ctx);
  else current = (PAGES[name] || overview)(main, ctx);
}

function onEvent(e) {
  window.__tp.events++;
  if (current && current.onEvent) {
    const t0 = performance.now();
    const done = current.onEvent(e);
    Promise.resolve(done).then(() => {
      window.__tp.renders.push(performance.now() - t0);
      if (window.__tp.renders.length > 5000) window.__tp.renders.splice(0, 1000);
    });
  }
}

async function start() {
  if (!api.token()) { ask(); return; }
  if (!(await signIn())) return;
  if (stopStream) stopStream();
  stopStream = api.stream(onEvent, setConn);
  route();
}

document.getElementById("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = document.getElementById("token-input").value.trim();
  if (!value) return;
  api.setToken(value);
  document.getElementById("token-input").value = "";
  document.getElementById("login").close();
  start();
});
document.getElementById("login").addEventListener("cancel", (ev) => ev.preventDefault());
api.whenUnauthorized(() => { api.forget(); if (stopStream) stopStream(); stopStream = null; setConn("offline"); ask("Signed out: the token was refused."); });
window.addEventListener("hashchange", () => { if (me) { route(); main.focus(); } });
start();

// Node-only: a Client from the arguments, TRIPLANE_URL / TRIPLANE_TOKEN, or the run
// directory of `triplane up` (TRIPLANE_HOME, default ~/.triplane: cluster.json's "url" and
// the file "token"), as tp.connect resolves it in Python. The library itself (index.js)
// imports nothing from Node.
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

import { Client } from "./client.js";
import { TriplaneError } from "./errors.js";

/**
 * Where to connect: `url`/`token`, else the environment, else the run directory.
 * @param {{url?: string|null, token?: string|null, home?: string|null}} [o]
 * @returns {{url: string, token: string|null}}
 */
export function resolveTarget(o = {}) {
  let url = o.url || process.env.TRIPLANE_URL || null;
  let token = o.token || process.env.TRIPLANE_TOKEN || null;
  const home = o.home || process.env.TRIPLANE_HOME || join(homedir(), ".triplane");
  const recorded = () => {
    let info = null;
    try { info = JSON.parse(readFileSync(join(home, "cluster.json"), "utf8")); } catch { /* none */ }
    let tok = null;
    try { tok = readFileSync(join(home, "token"), "utf8").trim() || null; } catch { /* none */ }
    return { url: typeof info?.url === "string" ? info.url : null, token: tok };
  };
  if (!url) {
    const found = recorded();
    if (!found.url) {
      throw new TriplaneError("no cluster to connect to: pass connect({url, token}), set TRIPLANE_URL, "
        + `or start one with \`triplane up\` (nothing found in ${home})`, { kind: "request" });
    }
    url = found.url;
    token = token || found.token;
  } else if (!token) {
    const found = recorded();
    if (found.url && found.url.replace(/\/+$/, "") === url.replace(/\/+$/, "")) token = found.token;
  }
  return { url, token };
}

/**
 * A Client for the resolved target; with `check` (default) it asks `GET /v1/whoami` at
 * once, so a wrong URL or token fails here.
 * @param {{url?: string|null, token?: string|null, home?: string|null, check?: boolean} & import("./client.js").RetryPolicy} [o]
 */
export async function connect(o = {}) {
  const { url, token } = resolveTarget(o);
  const client = new Client({ ...o, url, token });
  if (o.check ?? true) await client.whoami();
  return client;
}

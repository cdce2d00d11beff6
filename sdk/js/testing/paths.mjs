// Paths the tests read (the repository's proto/ directory).
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const SDK = join(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO = join(SDK, "..", "..");
export const VECTORS = join(REPO, "proto", "vectors");
export const OPS_JSON = join(REPO, "proto", "ops.json");

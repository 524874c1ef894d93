// A real supervisor in a temporary state directory, for the tests: started with
// `<python> -m supervisor --state-dir D --config C start` and stopped with `... stop` (or
// SIGKILLed by its pid and started again, for the ride-through tests).
// The interpreter is $CCSUP_PYTHON (the pytest wrapper sets it), else <repo>/.venv/bin/python.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const PYTHON = process.env.CCSUP_PYTHON || join(REPO, ".venv", "bin", "python");

// `wrapper`: a Python script of tests/helpers that runs ccsup its own way (killed_at.py,
// given `wrapperArgs` first): the supervisor runs in the foreground under it, detached, and is
// waited for until `status` answers.
export function startDaemon(caps, guardExtra = "", { wrapper, wrapperArgs = [] } = {}) {
  // ipc:// paths must stay under 107 bytes: a short directory under /tmp.
  const stateDir = mkdtempSync("/tmp/ccsup-node-");
  chmodSync(stateDir, 0o700);
  const config = join(stateDir, "ccsup.toml");
  writeFileSync(config, `[slots]\ncaps = { ${caps} }\n[guard]\ngrace = "300ms"\nscan = "200ms"\n${guardExtra}\n`);
  const env = { ...process.env, CCSUP_RESERVATION_TTL_MS: process.env.CCSUP_RESERVATION_TTL_MS || "3000" };
  const ccsup = ["--state-dir", stateDir, "--config", config];
  const plainStart = () =>
    execFileSync(PYTHON, ["-m", "supervisor", ...ccsup, "start"], {
      cwd: REPO, env, stdio: ["ignore", "ignore", "inherit"], timeout: 20000,
    });
  const wrappedStart = () => {
    const child = spawn(PYTHON, [join(REPO, "tests", "helpers", wrapper), ...wrapperArgs, ...ccsup, "start", "--foreground"], {
      cwd: REPO, env, stdio: "ignore", detached: true,
    });
    child.unref();
    const deadline = Date.now() + 30000;
    for (;;) {
      try {
        execFileSync(PYTHON, ["-m", "supervisor", "--state-dir", stateDir, "status"], { cwd: REPO, stdio: "ignore", timeout: 20000 });
        return;
      } catch (e) {
        if (Date.now() > deadline) throw e;
      }
    }
  };
  const start = wrapper ? wrappedStart : plainStart;
  start();
  return {
    stateDir,
    /** Started again on the same state directory (after `kill`). */
    start,
    /** The running supervisor's pid, as its lock file names it. */
    pid() {
      return Number.parseInt(readFileSync(join(stateDir, "supervisor.lock"), "utf8").trim(), 10);
    },
    stop() {
      try {
        execFileSync(PYTHON, ["-m", "supervisor", "--state-dir", stateDir, "stop", "--timeout", "20"], {
          cwd: REPO, stdio: ["ignore", "ignore", "inherit"], timeout: 30000,
        });
      } finally {
        rmSync(stateDir, { recursive: true, force: true });
      }
    },
  };
}

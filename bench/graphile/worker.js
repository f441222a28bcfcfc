// Graphile Worker's side of `make bench` (bench/peers.py starts it):
//
//   node worker.js migrate DSN
//   node worker.js run DSN CONCURRENCY LOCAL_QUEUE_SIZE
//
// `run` starts one worker pool with the settings of Graphile Worker's own
// perfTest (graphile.config.js in its repository): a pool one connection larger
// than the concurrency, a local queue of LOCAL_QUEUE_SIZE jobs refetched after
// 10 ms when a fetch comes back short, and completions and failures batched
// (delay 0). Two tasks: `noop` does nothing, `latency` appends the host time it
// started beside the enqueue time its payload carries, as bench.measure's
// record_start does for the Python queues. SIGTERM stops it gracefully.
"use strict";

const fs = require("fs");
const { Logger, run, runMigrations } = require("graphile-worker");

const quiet = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

const taskList = {
  noop: async () => {},
  latency: async (payload) => {
    const started = (performance.timeOrigin + performance.now()) / 1000;
    fs.appendFileSync(payload.path, `${payload.t} ${started}\n`);
  },
};

async function main() {
  const [mode, connectionString, concurrency, localQueueSize] = process.argv.slice(2);
  if (mode === "migrate") {
    await runMigrations({ connectionString, logger: quiet });
    return;
  }
  if (mode !== "run") throw new Error(`unknown mode ${mode}`);
  const jobs = Number(concurrency);
  const size = Number(localQueueSize);
  const runner = await run({
    connectionString,
    concurrency: jobs,
    maxPoolSize: jobs + 1,
    taskList,
    crontab: "",
    logger: quiet,
    preset: {
      worker: {
        localQueue: size > 0 ? { size, refetchDelay: { durationMs: 10 } } : { size: -1 },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
        gracefulShutdownAbortTimeout: 2500,
      },
    },
  });
  await runner.promise;
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

#!/usr/bin/env node
// node-redlock 4 + ioredis worker for dlock_bench (bench/peers.c drives it).
// The same line protocol as ../redispy_worker.py (one reply line per
// command, times in ns):
//   (at start)            "hello node-redlock <redlock>/<ioredis>" or "skip <reason>"
//   clock                 "clock <now_ns>"
//   pairs <name> <ms>     "ok <n> <elapsed_ns> <pair_us> ..."
//   hold <name> <cfg>     "ok"   (one attempt, must succeed)
//   release               "ok <t0_ns>"  (t0 just before unlock())
//   wait <name> <cfg>     "waiting", then "got <t1_ns> <cpu_ns>"
//   contend <name> <counter> <cfg> <start_ns> <end_ns>
//                         "ok <ops> <finish_ns> <wait_us> ..."
//   quit
// Clock: process.hrtime.bigint(). On Linux libuv reads it from
// clock_gettime(CLOCK_MONOTONIC), the C driver's clock; the driver does not
// rely on that: it measures this process's offset (the "clock" command,
// bracketed by its own reads) and converts every timestamp.
// cfg: "default" (redlock's retryDelay 200 ms, retryJitter 100 ms) or a retry
// delay in ms ("5": retryDelay 5, retryJitter 2, so retries come 3 to 7 ms
// apart; the default jitter of 100 ms would make most 5 ms retries immediate).
// Both wait without limit (retryCount -1: the default, 10 retries, gives up
// after about 2 s, which is not a blocking lock). Leases: 10 s for pairs,
// 30 s otherwise.
'use strict';
const readline = require('readline');

function out(s) { process.stdout.write(s + '\n'); }
const now = () => process.hrtime.bigint();

let Redis, Redlock;
try {
  Redis = require('ioredis');
  Redlock = require('redlock');
} catch (e) {
  out('skip node modules missing (run bench/setup: npm ci in bench/peers/node): ' + e.message.split('\n')[0]);
  process.exit(0);
}

const argv = process.argv;
const port = Number(argv[argv.indexOf('--port') + 1]);
const host = argv.includes('--host') ? argv[argv.indexOf('--host') + 1] : '127.0.0.1';
const client = new Redis({ host, port, lazyConnect: true, maxRetriesPerRequest: 1,
                           enableOfflineQueue: false });
client.on('error', () => {});

const locks = {};
function redlockFor(cfg) {
  if (!locks[cfg]) {
    const o = { retryCount: -1 };
    if (cfg !== 'default') { o.retryDelay = Number(cfg); o.retryJitter = 2; }
    locks[cfg] = new Redlock([client], o);
  }
  return locks[cfg];
}
const once = new Redlock([client], { retryCount: 0 });
const version = (m) => { try { return require(m + '/package.json').version; } catch (e) { return '?'; } };
const sleepNs = (ns) => new Promise((res) => setTimeout(res, Math.max(0, Number(ns / 1000000n))));

async function handle(a) {
  const cmd = a[0];
  if (cmd === 'clock') return 'clock ' + now();
  if (cmd === 'pairs') {
    const rl = redlockFor('default');
    const end = now() + BigInt(a[2]) * 1000000n;
    const lats = [];
    const start = now();
    let t = start;
    while (t < end) {
      const lock = await rl.lock(a[1], 10000);
      await lock.unlock();
      const t2 = now();
      lats.push((t2 - t) / 1000n);
      t = t2;
    }
    return 'ok ' + lats.length + ' ' + (t - start) + ' ' + lats.join(' ');
  }
  if (cmd === 'hold') {
    held = await once.lock(a[1], 30000);
    return 'ok';
  }
  if (cmd === 'release') {
    const t0 = now();
    await held.unlock();
    held = null;
    return 'ok ' + t0;
  }
  if (cmd === 'wait') {
    const rl = redlockFor(a[2]);
    const c0 = process.cpuUsage();
    out('waiting');
    const lock = await rl.lock(a[1], 30000);
    const t1 = now();
    const c = process.cpuUsage(c0);
    await lock.unlock();
    return 'got ' + t1 + ' ' + (c.user + c.system) * 1000;
  }
  if (cmd === 'contend') {
    const [name, counter, cfg] = [a[1], a[2], a[3]];
    const start = BigInt(a[4]), end = BigInt(a[5]);
    const rl = redlockFor(cfg);
    await sleepNs(start - now());
    while (now() < start) { /* the last < 1 ms */ }
    let ops = 0;
    const waits = [];
    let t = now();
    while (t < end) {
      const lock = await rl.lock(name, 30000);
      waits.push((now() - t) / 1000n);
      const v = await client.get(counter);
      await client.set(counter, Number(v || 0) + 1);
      await lock.unlock();
      ops++;
      t = now();
    }
    return 'ok ' + ops + ' ' + t + ' ' + waits.join(' ');
  }
  return 'err unknown command ' + cmd;
}

let held = null;
(async () => {
  try {
    await client.connect();
    await client.ping();
  } catch (e) {
    out('skip cannot reach redis at ' + host + ':' + port + ': ' + e.message);
    process.exit(0);
  }
  out('hello node-redlock ' + version('redlock') + '/ioredis-' + version('ioredis') +
      '/node-' + process.versions.node);
  const rli = readline.createInterface({ input: process.stdin });
  for await (const line of rli) {
    const a = line.trim().split(/\s+/);
    if (!a[0]) continue;
    if (a[0] === 'quit') break;
    try {
      out(await handle(a));
    } catch (e) {
      out('err ' + (e && e.message ? e.message.split('\n')[0] : String(e)));
    }
  }
  client.disconnect();
  process.exit(0);
})();

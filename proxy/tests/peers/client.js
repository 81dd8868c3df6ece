#!/usr/bin/env node
// The near end of the proxy's tests with node's `ws`: runs one scenario, as client.py does.
// Usage: client.js WS_URL SCENARIO [ARG...]. Prints `ok SCENARIO` and exits 0 when every check
// holds; a failed check exits 1 with the reason. Every wait is bounded by a timeout.
"use strict";

let WebSocket;
try {
  WebSocket = require("ws");
} catch (e) {
  console.error("node module `ws` is missing (the tests install it under target/tmp/installs and put it on NODE_PATH)");
  process.exit(1);
}

const MAX_SIZE = 64 * 1024 * 1024;
const TIMEOUT_MS = 10000;

function check(condition, what) {
  if (!condition) throw new Error(what);
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// A connection whose messages and end are awaited in order.
async function open(url) {
  const ws = new WebSocket(url, { maxPayload: MAX_SIZE, perMessageDeflate: false });
  const queue = [];
  const waiters = [];
  let ended = null;
  const closed = new Promise((resolve) => {
    ws.on("close", (code, reason) => {
      ended = { code, reason: reason.toString() };
      resolve(ended);
      while (waiters.length) waiters.shift().reject(new Error(`closed ${code} ${ended.reason}`));
    });
  });
  ws.on("error", () => {});
  ws.on("message", (data, isBinary) => {
    const message = isBinary ? Buffer.from(data) : data.toString();
    if (waiters.length) waiters.shift().resolve(message);
    else queue.push(message);
  });
  await withTimeout(new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("unexpected-response", (_, response) => reject(new Error(`HTTP ${response.statusCode}`)));
    ws.once("close", () => reject(new Error("closed before open")));
  }), TIMEOUT_MS, "open");
  const recv = (ms = TIMEOUT_MS) => {
    if (queue.length) return Promise.resolve(queue.shift());
    if (ended) return Promise.reject(new Error(`closed ${ended.code} ${ended.reason}`));
    return withTimeout(new Promise((resolve, reject) => waiters.push({ resolve, reject })), ms, "recv");
  };
  return { ws, recv, closed: (ms = TIMEOUT_MS) => withTimeout(closed, ms, "close") };
}

const same = (a, b) => (Buffer.isBuffer(a) && Buffer.isBuffer(b) ? a.equals(b) : a === b);

async function echo(conn, message) {
  conn.ws.send(message);
  const back = await conn.recv();
  check(same(back, message), `echo changed the message: sent ${String(message).slice(0, 80)}`);
}

async function serverCloses(url, path) {
  for (let i = 0; i < 50; i++) {
    const probe = await open(url + "/probe");
    probe.ws.send(JSON.stringify({ cmd: "closes" }));
    const seen = JSON.parse(await probe.recv()).closes.filter((c) => c.path === path);
    probe.ws.close();
    if (seen.length) return seen[seen.length - 1];
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`the server never saw the connection to ${path} close`);
}

const SCENARIOS = {
  async text_binary(url) {
    const conn = await open(url);
    for (const m of ["hello", "", "snow ☃ and emoji 🦀", Buffer.from([...Array(256).keys()]), Buffer.alloc(0)]) {
      await echo(conn, m);
    }
    conn.ws.close();
  },
  async ping_pong(url) {
    const conn = await open(url);
    const pong = new Promise((resolve) => conn.ws.once("pong", (p) => resolve(p.toString())));
    conn.ws.ping(Buffer.from("client-ping"));
    check((await withTimeout(pong, TIMEOUT_MS, "pong")) === "client-ping", "pong payload");
    conn.ws.send(JSON.stringify({ cmd: "ping", payload: "server-ping" }));
    check(JSON.parse(await conn.recv()).pong === "server-ping", "server ping");
    conn.ws.close();
  },
  async client_close(url) {
    const path = "/client-close";
    const conn = await open(url + path);
    await echo(conn, "before close");
    conn.ws.close(4001, "client bye");
    const end = await conn.closed();
    check(end.code === 4001 && end.reason === "client bye", `close reply ${JSON.stringify(end)}`);
    const seen = await serverCloses(url, path);
    check(seen.code === 4001 && seen.reason === "client bye", `server saw ${JSON.stringify(seen)}`);
  },
  async server_close(url) {
    const conn = await open(url);
    conn.ws.send(JSON.stringify({ cmd: "close", code: 4002, reason: "server bye" }));
    const end = await conn.closed();
    check(end.code === 4002 && end.reason === "server bye", `got close ${JSON.stringify(end)}`);
  },
  async upstream_reset(url) {
    const conn = await open(url);
    await echo(conn, "before reset");
    conn.ws.send(JSON.stringify({ cmd: "abort" }));
    const end = await conn.closed();
    check(end.code === 1006, `expected no close frame (1006), got ${JSON.stringify(end)}`);
  },
  async large(url) {
    const conn = await open(url);
    const big = Buffer.alloc(8 * 1024 * 1024, 7);
    await echo(conn, big);
    await echo(conn, "x".repeat(4 * 1024 * 1024));
    conn.ws.close();
  },
  async oversize(url) {
    // Run against a proxy started with --max-frame-bytes 1048576; several rounds, as client.py.
    for (let round = 0; round < 5; round++) {
      const conn = await open(url);
      await echo(conn, Buffer.alloc(1024 * 1024, 1));
      conn.ws.send(Buffer.alloc(2 * 1024 * 1024, 2));
      const end = await conn.closed();
      check(end.code === 1009, `round ${round}: expected close 1009, got ${JSON.stringify(end)}`);
    }
  },
  async delays_together(url) {
    // Run with: --rule 'delay=300 always up text=slow'.
    const conn = await open(url);
    const frames = [...Array(10).keys()].map((i) => JSON.stringify({ text: "slow", i }));
    const start = Date.now();
    for (const f of frames) conn.ws.send(f);
    const got = [];
    for (let i = 0; i < frames.length; i++) got.push(await conn.recv());
    const elapsed = (Date.now() - start) / 1000;
    check(JSON.stringify(got) === JSON.stringify(frames), `delayed frames out of order: ${got}`);
    check(elapsed >= 0.29, `ten frames delayed 300 ms arrived after ${elapsed} s`);
    check(elapsed < 1.5, `ten frames delayed 300 ms each took ${elapsed} s: the delays ran one after another`);
    conn.ws.close();
  },
  async keepalive_during_delay(url) {
    // Run with: --rule 'delay=5000 once up type=slow'. A keepalive that pings every 0.5 s and
    // gives up after 2 s without a pong must survive a frame held for 5 s.
    const conn = await open(url);
    let lastPong = Date.now();
    conn.ws.on("pong", () => (lastPong = Date.now()));
    const keepalive = setInterval(() => {
      if (Date.now() - lastPong > 2500) conn.ws.terminate();
      else conn.ws.ping();
    }, 500);
    try {
      const slow = JSON.stringify({ type: "slow" });
      conn.ws.send(slow);
      check((await conn.recv(15000)) === slow, "echo of the delayed frame");
      await echo(conn, "still open");
    } finally {
      clearInterval(keepalive);
    }
    conn.ws.close();
  },
};

async function main() {
  const [url, scenario, ...extra] = process.argv.slice(2);
  await withTimeout(SCENARIOS[scenario](url, ...extra), 60000, scenario);
  console.log(`ok ${scenario}`);
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e.stack || String(e));
    process.exit(1);
  }
);

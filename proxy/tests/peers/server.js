#!/usr/bin/env node
// The far end of the proxy's tests with node's `ws`: the same commands as server.py, for the
// scenarios client.js runs. Prints its port on the first line of stdout. A text frame holding
// a JSON object with a "cmd" key is a command; every other frame is echoed.
"use strict";

let WebSocketServer;
try {
  ({ WebSocketServer } = require("ws"));
} catch (e) {
  console.error("node module `ws` is missing (the tests install it under target/tmp/installs and put it on NODE_PATH)");
  process.exit(1);
}

const MAX_SIZE = 64 * 1024 * 1024;
// How each finished connection was closed, as this server saw it (bounded: tests open few).
const CLOSES = [];

const server = new WebSocketServer({ host: "127.0.0.1", port: 0, maxPayload: MAX_SIZE, perMessageDeflate: false });
server.on("listening", () => console.log(server.address().port));
server.on("connection", (ws, request) => {
  ws.on("message", (data, isBinary) => {
    let cmd = null;
    if (!isBinary) {
      try {
        const parsed = JSON.parse(data.toString());
        if (parsed && typeof parsed === "object" && "cmd" in parsed) cmd = parsed;
      } catch (e) {}
    }
    if (cmd === null) {
      ws.send(data, { binary: isBinary });
    } else if (cmd.cmd === "close") {
      ws.close(cmd.code, cmd.reason);
    } else if (cmd.cmd === "abort") {
      ws._socket.resetAndDestroy();
    } else if (cmd.cmd === "closes") {
      ws.send(JSON.stringify({ closes: CLOSES }));
    } else if (cmd.cmd === "ping") {
      ws.once("pong", (payload) => ws.send(JSON.stringify({ pong: payload.toString() })));
      ws.ping(Buffer.from(cmd.payload));
    } else {
      ws.send(JSON.stringify({ error: `unknown command ${cmd.cmd}` }));
    }
  });
  ws.on("close", (code, reason) => {
    if (CLOSES.length < 1000) CLOSES.push({ path: request.url, code, reason: reason.toString() });
  });
  ws.on("error", () => {});
});
// Bounded: a test that forgets the server still ends it within ten minutes.
setTimeout(() => process.exit(0), 600 * 1000).unref();

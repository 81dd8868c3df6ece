#!/usr/bin/env python3
"""The far end of the proxy's tests: a `websockets` server that echoes and obeys commands.

It prints its port on the first line of stdout. A text frame holding a JSON object with a
"cmd" key is a command (see `handle_command`); every other frame is recorded and echoed.
"""

import asyncio
import json
import sys

try:
    import websockets
    from websockets.asyncio.server import serve
except ImportError:
    sys.exit("python module `websockets` is missing: the tests run this script in a virtual environment they make under target/tmp/installs")

MAX_SIZE = 64 * 1024 * 1024
# How each finished connection was closed, as this server saw it (bounded: tests open few).
CLOSES = []


def select_subprotocol(connection, offered):
    for protocol in offered:
        if protocol in ("rig.v1", "rig.v2"):
            return protocol
    return None


def describe(message):
    if isinstance(message, str):
        return message
    return {"binary_len": len(message), "first": message[:16].hex()}


async def handle_command(ws, cmd, received):
    name = cmd["cmd"]
    if name == "info":
        headers = {k.lower(): v for k, v in ws.request.headers.raw_items()}
        await ws.send(json.dumps({"path": ws.request.path, "subprotocol": ws.subprotocol, "headers": headers}))
    elif name == "received":
        await ws.send(json.dumps({"received": [describe(m) for m in received]}))
    elif name == "send":
        for message in cmd["messages"]:
            await ws.send(message)
    elif name == "send_binary":
        await ws.send(bytes.fromhex(cmd["hex"]))
    elif name == "fragmented":
        await ws.send(cmd["parts"])
    elif name == "ping":
        waiter = await ws.ping(cmd["payload"].encode())
        await asyncio.wait_for(waiter, 5)
        await ws.send(json.dumps({"pong": cmd["payload"]}))
    elif name == "close":
        await ws.close(cmd["code"], cmd["reason"])
    elif name == "abort":
        ws.transport.abort()
    elif name == "closes":
        await ws.send(json.dumps({"closes": CLOSES}))
    else:
        await ws.send(json.dumps({"error": f"unknown command {name}"}))


async def handler(ws):
    received = []
    try:
        async for message in ws:
            cmd = None
            if isinstance(message, str):
                try:
                    parsed = json.loads(message)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict) and "cmd" in parsed:
                    cmd = parsed
            if cmd is None:
                received.append(message)
                await ws.send(message)
            else:
                await handle_command(ws, cmd, received)
    except websockets.ConnectionClosed:
        pass
    finally:
        # close_code is the code of the close frame received from the proxy (1006 if none).
        if len(CLOSES) < 1000:
            CLOSES.append({"path": ws.request.path, "code": ws.close_code, "reason": ws.close_reason})


async def main():
    async with serve(
        handler,
        "127.0.0.1",
        0,
        max_size=MAX_SIZE,
        select_subprotocol=select_subprotocol,
        compression=None,
    ) as server:
        port = server.sockets[0].getsockname()[1]
        print(port, flush=True)
        # Bounded: a test that forgets the server still ends it within ten minutes.
        await asyncio.sleep(600)


if __name__ == "__main__":
    asyncio.run(main())

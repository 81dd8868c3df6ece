#!/usr/bin/env python3
"""The near end of the proxy's tests: a `websockets` client that runs one scenario.

Usage: client.py WS_URL SCENARIO [ARG...]. Prints `ok SCENARIO` and exits 0 when every check holds;
a failed check raises (exit 1). Every wait is bounded by a timeout.
"""

import asyncio
import json
import sys

try:
    import websockets
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus
except ImportError:
    sys.exit("python module `websockets` is missing: the tests run this script in a virtual environment they make under target/tmp/installs")

MAX_SIZE = 64 * 1024 * 1024
TIMEOUT = 10


def open_ws(url, **kwargs):
    return connect(url, max_size=MAX_SIZE, compression=None, open_timeout=TIMEOUT, close_timeout=TIMEOUT, **kwargs)


async def recv(ws):
    return await asyncio.wait_for(ws.recv(), TIMEOUT)


async def command(ws, **cmd):
    await ws.send(json.dumps(cmd))
    return json.loads(await recv(ws))


def check(condition, what):
    if not condition:
        raise AssertionError(what)


async def echo(ws, message):
    await ws.send(message)
    back = await recv(ws)
    check(back == message, f"echo changed the message: sent {message!r:.80}, got {back!r:.80}")


async def server_closes(url, path, code):
    """The close the server saw on the connection to `path`; polls a fresh connection."""
    for _ in range(50):
        async with open_ws(url + "/probe") as probe:
            closes = (await command(probe, cmd="closes"))["closes"]
        seen = [c for c in closes if c["path"] == path]
        if seen:
            return seen[-1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"the server never saw the connection to {path} close (expected {code})")


async def text_binary(url):
    async with open_ws(url) as ws:
        await echo(ws, "hello")
        await echo(ws, "")
        await echo(ws, "snow ☃ and emoji 🦀")
        await echo(ws, bytes(range(256)))
        await echo(ws, b"")
        received = (await command(ws, cmd="received"))["received"]
        check(received[0] == "hello" and received[3]["binary_len"] == 256, f"server saw {received}")


async def non_json(url):
    # Run with rules that have JSON conditions: frames that are not JSON objects must pass.
    async with open_ws(url) as ws:
        for message in ["not json {", "[1, 2", "42", "null", '"a string"', '{"type": "other"}', "\x00\x01"]:
            await echo(ws, message)
        await echo(ws, b'{"type": "x"}')


async def ping_pong(url):
    async with open_ws(url, ping_interval=None) as ws:
        waiter = await ws.ping(b"client-ping")
        await asyncio.wait_for(waiter, TIMEOUT)
        reply = await command(ws, cmd="ping", payload="server-ping")
        check(reply == {"pong": "server-ping"}, f"server ping: {reply}")
        await echo(ws, "still open")


async def fragmented(url):
    async with open_ws(url) as ws:
        await ws.send(["frag-1 ", "frag-2 ", "frag-3"])
        back = await recv(ws)
        check(back == "frag-1 frag-2 frag-3", f"fragmented echo: {back!r}")
        await ws.send([b"\x01\x02", b"\x03"])
        back = await recv(ws)
        check(back == b"\x01\x02\x03", f"fragmented binary echo: {back!r}")
        await ws.send(json.dumps({"cmd": "fragmented", "parts": ["down-1 ", "down-2"]}))
        back = await recv(ws)
        check(back == "down-1 down-2", f"fragmented from server: {back!r}")


async def client_close(url):
    path = "/client-close"
    async with open_ws(url + path) as ws:
        await echo(ws, "before close")
        await ws.close(4001, "client bye")
        check(ws.close_code == 4001 and ws.close_reason == "client bye", f"close reply {ws.close_code} {ws.close_reason!r}")
    seen = await server_closes(url, path, 4001)
    check(seen["code"] == 4001 and seen["reason"] == "client bye", f"server saw {seen}")


async def server_close(url):
    async with open_ws(url) as ws:
        await ws.send(json.dumps({"cmd": "close", "code": 4002, "reason": "server bye"}))
        try:
            await recv(ws)
            raise AssertionError("expected the connection to close")
        except ConnectionClosed as closed:
            check(closed.rcvd is not None, "no close frame received")
            check((closed.rcvd.code, closed.rcvd.reason) == (4002, "server bye"), f"got close {closed.rcvd}")


async def upstream_reset(url):
    async with open_ws(url) as ws:
        await echo(ws, "before reset")
        await ws.send(json.dumps({"cmd": "abort"}))
        try:
            await recv(ws)
            raise AssertionError("expected the connection to end")
        except ConnectionClosedError as closed:
            check(closed.rcvd is None, f"expected no close frame (1006), got {closed.rcvd}")


async def large(url):
    async with open_ws(url) as ws:
        big = bytes(i % 251 for i in range(8 * 1024 * 1024))
        await echo(ws, big)
        text = "x" * (4 * 1024 * 1024)
        await echo(ws, text)


async def oversize(url):
    # Run against a proxy started with --max-frame-bytes 1048576. Several rounds: a proxy that
    # closes without reading what the client is still sending resets the connection in most
    # of them, and the 1009 is lost.
    for _ in range(5):
        async with open_ws(url) as ws:
            await echo(ws, b"y" * (1024 * 1024))
            await ws.send(b"z" * (2 * 1024 * 1024))
            try:
                await recv(ws)
                raise AssertionError("expected the proxy to refuse the oversized message")
            except ConnectionClosed as closed:
                check(closed.rcvd is not None and closed.rcvd.code == 1009, f"expected close 1009, got {closed.rcvd}")


async def handshake_passthrough(url):
    async with open_ws(url + "/sessions/s1?token=abc&x=1", subprotocols=["rig.v2", "other"],
                       additional_headers={"Authorization": "Bearer secret", "X-Rig": "yes"}) as ws:
        check(ws.subprotocol == "rig.v2", f"subprotocol {ws.subprotocol}")
        info = await command(ws, cmd="info")
        check(info["path"] == "/sessions/s1?token=abc&x=1", f"path {info['path']}")
        check(info["subprotocol"] == "rig.v2", f"server subprotocol {info['subprotocol']}")
        check(info["headers"].get("authorization") == "Bearer secret", f"headers {info['headers']}")
        check(info["headers"].get("x-rig") == "yes", f"headers {info['headers']}")
    async with open_ws(url + "/plain") as ws:
        check(ws.subprotocol is None, f"unexpected subprotocol {ws.subprotocol}")
        info = await command(ws, cmd="info")
        check(info["subprotocol"] is None, f"server subprotocol {info['subprotocol']}")


async def unreachable(url):
    try:
        async with open_ws(url):
            raise AssertionError("connected through a proxy whose upstream is down")
    except InvalidStatus as refused:
        status = refused.response.status_code
        body = refused.response.body.decode(errors="replace")
        check(status == 502, f"expected 502, got {status}")
        check("unreachable" in body, f"body {body!r}")
        print(body.strip())


def invocation(i, function_id, session_id):
    return json.dumps({"type": "invocationresult", "id": i, "function_id": function_id,
                       "result": {"session_id": session_id, "step": i}})


def stream_of_frames():
    """Many frames, two of them the invocationresult for harness::turn of session s1."""
    frames = []
    for i in range(60):
        if i in (17, 41):
            frames.append(invocation(i, "harness::turn", "s1"))
        elif i % 5 == 0:
            frames.append(invocation(i, "harness::turn", "s2"))
        elif i % 5 == 1:
            frames.append(invocation(i, "tools::search", "s1"))
        elif i % 5 == 2:
            frames.append(json.dumps({"type": "invocation", "id": i, "function_id": "harness::turn",
                                      "result": {"session_id": "s1"}}))
        elif i % 5 == 3:
            frames.append(f"plain text {i}")
        else:
            frames.append(json.dumps({"type": "heartbeat", "id": i}))
    return frames


async def drop_one_up(url):
    # Run with: --rule 'drop once up type=invocationresult function_id=harness::turn result.session_id=s1'
    frames = stream_of_frames()
    async with open_ws(url) as ws:
        for frame in frames:
            await ws.send(frame)
        echoes = [await recv(ws) for _ in range(len(frames) - 1)]
        received = (await command(ws, cmd="received"))["received"]
    expected = frames[:17] + frames[18:]
    check(received == expected, f"server received {len(received)} frames, expected {len(expected)} "
          f"(first difference at {next((i for i, (a, b) in enumerate(zip(received, expected)) if a != b), None)})")
    check(echoes == expected, "echoes differ from the frames the server received")


async def drop_one_down(url):
    # Run with: --rule 'drop once down type=invocationresult function_id=harness::turn result.session_id=s1'
    frames = stream_of_frames()
    async with open_ws(url) as ws:
        await ws.send(json.dumps({"cmd": "send", "messages": frames}))
        got = [await recv(ws) for _ in range(len(frames) - 1)]
        await ws.send("marker")
        check(await recv(ws) == "marker", "the marker echo did not come right after the stream")
    expected = frames[:17] + frames[18:]
    check(got == expected, "the client did not receive every frame but the one dropped, in order")


async def duplicate_and_delay(url):
    # Run with: --rule 'duplicate once up text=dup' --rule 'delay=300 once up text=slow'
    async with open_ws(url) as ws:
        loop = asyncio.get_running_loop()
        await ws.send(json.dumps({"text": "dup"}))
        first, second = await recv(ws), await recv(ws)
        check(first == second == json.dumps({"text": "dup"}), f"duplicate: {first!r} {second!r}")
        start = loop.time()
        await ws.send(json.dumps({"text": "slow"}))
        await ws.send("after slow")
        check(await recv(ws) == json.dumps({"text": "slow"}), "delayed frame out of order")
        check(await recv(ws) == "after slow", "frame behind the delayed one overtook it")
        elapsed = loop.time() - start
        check(elapsed >= 0.29, f"delay of 300 ms took {elapsed:.3f} s")


async def delays_together(url):
    # Run with: --rule 'delay=300 always up text=slow'. Ten frames sent together are each
    # held for 300 ms from their own arrival, so all ten arrive after about 300 ms, in order
    # (one after another they would take 3 s).
    async with open_ws(url) as ws:
        loop = asyncio.get_running_loop()
        frames = [json.dumps({"text": "slow", "i": i}) for i in range(10)]
        start = loop.time()
        for frame in frames:
            await ws.send(frame)
        got = [await recv(ws) for _ in frames]
        elapsed = loop.time() - start
        check(got == frames, f"delayed frames out of order: {got}")
        check(elapsed >= 0.29, f"ten frames delayed 300 ms arrived after {elapsed:.3f} s")
        check(elapsed < 1.5, f"ten frames delayed 300 ms each took {elapsed:.3f} s: the delays ran one after another")


async def keepalive_during_delay(url):
    # Run with: --rule 'delay=5000 once up type=slow'. The client's keepalive pings every
    # 0.5 s and gives up after 2 s without a pong: it must survive a frame held for 5 s.
    async with open_ws(url, ping_interval=0.5, ping_timeout=2) as ws:
        slow = json.dumps({"type": "slow"})
        await ws.send(slow)
        back = await asyncio.wait_for(ws.recv(), 15)
        check(back == slow, f"echo of the delayed frame: {back!r}")
        await echo(ws, "still open")


async def shutdown(url, server_url):
    # The test sends the proxy SIGTERM once this prints `ready`.
    path = "/shutdown"
    async with open_ws(url + path) as ws:
        await echo(ws, "before shutdown")
        print("ready", flush=True)
        try:
            await asyncio.wait_for(ws.recv(), 30)
            raise AssertionError("expected the proxy to close the connection")
        except ConnectionClosed as closed:
            check(closed.rcvd is not None and closed.rcvd.code == 1001, f"expected close 1001, got {closed.rcvd}")
    seen = await server_closes(server_url, path, 1001)
    check(seen["code"] == 1001, f"server saw {seen}")


async def rule_close(url):
    # Run with: --rule 'close=4100:cut_by_rule once up type=cut'
    path = "/rule-close"
    async with open_ws(url + path) as ws:
        await echo(ws, "fine")
        await ws.send(json.dumps({"type": "cut"}))
        try:
            await recv(ws)
            raise AssertionError("expected the rule to close the connection")
        except ConnectionClosed as closed:
            check(closed.rcvd is not None and (closed.rcvd.code, closed.rcvd.reason) == (4100, "cut_by_rule"),
                  f"client got {closed.rcvd}")
    seen = await server_closes(url, path, 4100)
    check((seen["code"], seen["reason"]) == (4100, "cut_by_rule"), f"server saw {seen}")


async def admin_drop(url):
    # Run after an admin POST added `drop once up type=admin`.
    async with open_ws(url) as ws:
        await ws.send(json.dumps({"type": "admin"}))
        await echo(ws, "after")
        received = (await command(ws, cmd="received"))["received"]
        check(received == ["after"], f"server received {received}")


async def passes_all(url):
    async with open_ws(url) as ws:
        await echo(ws, json.dumps({"type": "admin"}))


SCENARIOS = {f.__name__: f for f in [
    text_binary, non_json, ping_pong, fragmented, client_close, server_close, upstream_reset, large,
    oversize, handshake_passthrough, unreachable, drop_one_up, drop_one_down, duplicate_and_delay,
    rule_close, admin_drop, passes_all, delays_together, keepalive_during_delay, shutdown,
]}


async def main(url, scenario, *extra):
    await asyncio.wait_for(SCENARIOS[scenario](url, *extra), 60)
    print(f"ok {scenario}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))

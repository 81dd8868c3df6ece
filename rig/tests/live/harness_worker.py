"""A harness worker in Python, on the real iii SDK from PyPI (iii-sdk==0.25.0), for `rig live`.

It serves `harness::turn` as the rig's smoke and finalisation scenarios judge a harness: read
the turn record, read the session's messages, ask the model, and finalise. Finalising records
the terminal state (a write whose outcome is unknown is sent once more, then confirmed by one
exact readback), presents it on the session (best effort), and reseeds input queued meanwhile
as a new turn, held when it cannot be enqueued. A finalisation that cannot be recorded now is
retried in the background, as terminalisation only. Tool calls are not implemented: the model's
reply is taken as the turn's result.

`--swallow` plants incident 001's bug: an error while finalising turns into "running, skipped"
and nothing retries it, so the turn never ends. The rig's `liveness` oracle must catch it.

The run's harness settings (the scenario's deadlines, attempts, backoff) come from the rig's
`rig::config` function, asked at the start of every turn. The worker tells it, as
`quiet_after_ms`, the longest it ever waits by itself (its longest deadline or backoff), so a
run whose turn never ends is judged as soon as the world has been quiet that long.

The engine's URL is `--url`, else `III_URL` (which `rig live --spawn` sets, and the SDK reads),
else the SDK's default; the harness host it serves is `RIG_HOST`, else `harness`.

    python3 harness_worker.py [--url ws://127.0.0.1:49134] [--swallow]
"""

import argparse
import os
import threading
import time
import uuid

from iii import InitOptions, InvocationError, TriggerAction, register_worker

TURN_SCOPE = "harness_turn"
QUEUE_SCOPE = "harness_queue"
TERMINAL = ("completed", "failed", "cancelled")
DEFERRED_BACKOFF_MS_MAX = 5_000
RIG_CONFIG_TIMEOUT_MS = 5_000
# Beyond its longest wait, what scheduling a thread may take on a loaded machine.
QUIET_SLACK_MS = 250
# Error codes after which a call may still have taken effect.
OUTCOME_UNKNOWN = ("TIMEOUT", "invocation_stopped")


def now_ms():
    return int(time.time() * 1000)


class Harness:
    def __init__(self, worker, host, swallow):
        self.worker = worker
        self.host = host
        self.swallow = swallow
        self.declared = None

    def call(self, function_id, payload, timeout_ms, action=None):
        request = {"function_id": function_id, "payload": payload, "timeout_ms": timeout_ms}
        if action is not None:
            request["action"] = action
        return self.worker.trigger(request)

    def get_turn(self, session_id, cfg):
        record = self.call("state::get", {"scope": TURN_SCOPE, "key": session_id}, cfg["session_timeout_ms"])
        return record or None

    def put_turn(self, record, cfg):
        """Writes a turn record, once more with the identical record if the outcome is unknown."""
        write = {"scope": TURN_SCOPE, "key": record["session_id"], "value": record}
        try:
            self.call("state::set", write, cfg["session_timeout_ms"])
        except InvocationError as error:
            if error.code not in OUTCOME_UNKNOWN:
                raise
            self.call("state::set", write, cfg["session_timeout_ms"])

    def put_terminal(self, record, cfg):
        try:
            self.put_turn(record, cfg)
        except InvocationError as error:
            if self.swallow or error.code not in OUTCOME_UNKNOWN:
                raise
            # An unknown outcome does not prove the write is absent: one exact readback.
            try:
                observed = self.get_turn(record["session_id"], cfg)
            except InvocationError:
                raise error
            if observed != record:
                raise error

    def skipped(self, request, reason):
        result = {"session_id": request["session_id"], "turn_id": request["turn_id"], "status": "running",
                  "skipped": True, "next_step": None}
        if not self.swallow:
            result.update(status="skipped", reason=reason)
        return result

    def config(self):
        """The run's settings; when they change, the rig is told the longest this worker waits by itself."""
        answer = self.call("rig::config", {"host": self.host}, RIG_CONFIG_TIMEOUT_MS)
        cfg = answer["config"]
        quiet = quiet_after_ms(cfg)
        if self.declared != (answer["incarnation"], quiet):
            self.call("rig::config", {"host": self.host, "quiet_after_ms": quiet}, RIG_CONFIG_TIMEOUT_MS)
            self.declared = (answer["incarnation"], quiet)
        return cfg

    def turn(self, request):
        cfg = self.config()
        record = self.get_turn(request["session_id"], cfg)
        if record is None or not is_current(record, request):
            return self.skipped(request, "stale")
        session_id = request["session_id"]
        try:
            messages = self.call("session::messages", {"session_id": session_id}, cfg["session_timeout_ms"])
        except InvocationError as error:
            return self.fail_turn(request, cfg, f"session::messages: {error}")
        prompt = {"session_id": session_id, "turn_id": record["turn_id"], "step": record["step"],
                  "messages": (messages or {}).get("entries")}
        try:
            reply = self.call("model::generate", prompt, cfg["model_timeout_ms"])
        except InvocationError as error:
            return self.fail_turn(request, cfg, f"model::generate: {error}")
        record.update(status="completed", turn_count=record.get("turn_count", 0) + 1, result=reply,
                      updated_at=now_ms())
        return self.close(request, cfg, record)

    def fail_turn(self, request, cfg, cause):
        try:
            record = self.get_turn(request["session_id"], cfg)
        except InvocationError as error:
            if self.swallow:
                # The released bug: the read error becomes "no record", and so a skip.
                return self.skipped(request, "unreadable")
            return self.unfinalized(request, cfg, {"cause": cause}, error)
        if record is None or not is_current(record, request):
            return self.skipped(request, "not current")
        record.update(status="failed", result_error=cause, updated_at=now_ms())
        return self.close(request, cfg, record)

    def close(self, request, cfg, terminal):
        try:
            self.put_terminal(terminal, cfg)
        except InvocationError as error:
            return self.unfinalized(request, cfg, {"record": terminal}, error)
        return self.after_terminal(cfg, terminal)

    def unfinalized(self, request, cfg, intent, error):
        """What the caller hears when the terminal state could not be recorded now."""
        if self.swallow:
            return self.skipped(request, "finalization failed")
        threading.Thread(target=self.terminalize_later, args=(request, cfg, intent), daemon=True).start()
        status = intent["record"]["status"] if "record" in intent else "failed"
        return {"session_id": request["session_id"], "turn_id": request["turn_id"], "status": status,
                "skipped": False, "next_step": None, "finalized": False,
                "reason": f"terminal state not yet recorded: {error}"}

    def terminalize_later(self, request, cfg, intent):
        """Retries finalisation as terminalisation only; never re-runs the model."""
        status = intent["record"]["status"] if "record" in intent else "failed"
        for attempt in range(1, cfg["terminalize_attempts"] + 1):
            backoff = min(cfg["terminalize_backoff_ms"] * 2 ** (attempt - 1), DEFERRED_BACKOFF_MS_MAX)
            time.sleep(backoff / 1000)
            try:
                record = self.get_turn(request["session_id"], cfg)
            except InvocationError:
                continue
            if record is None:
                return
            if record["turn_id"] == request["turn_id"] and record.get("status") in TERMINAL:
                if record["status"] == status:
                    # The write landed though its acknowledgement did not.
                    self.after_terminal(cfg, record)
                return
            if not is_current(record, request):
                return
            terminal = intent.get("record") or dict(record, status="failed", result_error=intent["cause"],
                                                    updated_at=now_ms())
            try:
                self.put_terminal(terminal, cfg)
            except InvocationError:
                continue
            self.after_terminal(cfg, terminal)
            return

    def after_terminal(self, cfg, terminal):
        """Presentation (best effort: the durable record already says what happened), then reseeding."""
        session_id, timeout = terminal["session_id"], cfg["session_timeout_ms"]
        if terminal["status"] == "completed":
            entry, session_status = {"role": "assistant", "text": (terminal.get("result") or {}).get("text")}, "idle"
        else:
            entry, session_status = {"role": "system", "kind": "error", "text": terminal.get("result_error")}, "error"
        for function_id, payload in (("session::append", {"session_id": session_id, "entry": entry}),
                                     ("session::set-status", {"session_id": session_id, "status": session_status})):
            try:
                self.call(function_id, payload, timeout)
            except InvocationError:
                pass
        result = {"session_id": session_id, "turn_id": terminal["turn_id"], "status": terminal["status"],
                  "skipped": False, "next_step": None}
        reseed = self.reseed(cfg, terminal)
        if reseed is not None and not self.swallow:
            result["reseed"] = reseed
        return result

    def reseed(self, cfg, predecessor):
        """Moves input queued for the session into a new turn and enqueues it; holds it when it cannot."""
        timeout, session_id = cfg["session_timeout_ms"], predecessor["session_id"]
        try:
            listed = self.call("state::list", {"scope": QUEUE_SCOPE}, timeout) or []
        except InvocationError as error:
            return {"admitted": False, "error": str(error)}
        queued = [entry for entry in listed if entry["value"].get("session_id") == session_id]
        if not queued:
            return None
        turn_id = f"t-{uuid.uuid4()}"
        turn = {"session_id": session_id, "turn_id": turn_id, "status": "running", "step": 0, "turn_count": 0,
                "depth": 0, "abort": False, "calls": {}, "input": [entry["value"]["message"] for entry in queued],
                "created_at": now_ms(), "updated_at": now_ms()}
        try:
            self.put_turn(turn, cfg)
        except InvocationError as error:
            return {"admitted": False, "error": str(error)}
        for entry in queued:
            try:
                self.call("state::delete", {"scope": QUEUE_SCOPE, "key": entry["key"]}, timeout)
            except InvocationError:
                pass
        request = {"session_id": session_id, "turn_id": turn_id, "step": 0, "depth": 0}
        attempts, last_error = cfg["enqueue_attempts"], ""
        for attempt in range(1, attempts + 1):
            try:
                self.call(f"{self.host}::turn", request, timeout, TriggerAction.Enqueue(queue=cfg["turn_queue"]))
                return {"turn_id": turn_id, "admitted": True, "attempts": attempt}
            except InvocationError as error:
                last_error = str(error)
        if self.swallow:
            return None
        turn.update(status="held", held_reason=f"enqueue exhausted after {attempts} attempts: {last_error}",
                    updated_at=now_ms())
        try:
            self.put_turn(turn, cfg)
            held = True
        except InvocationError:
            held = False
        return {"turn_id": turn_id, "admitted": False, "attempts": attempts, "error": last_error, "held": held}


def quiet_after_ms(cfg):
    """The longest this worker waits by itself between two of its calls: a deferred retry's backoff.
    (Waiting for a call's answer does not count: the rig sees the call in flight.)"""
    attempts = max(cfg["terminalize_attempts"] - 1, 0)
    return min(cfg["terminalize_backoff_ms"] * 2 ** attempts, DEFERRED_BACKOFF_MS_MAX) + QUIET_SLACK_MS


def is_current(record, request):
    """Whether a delivery is for the turn the record says is running, at or past its step."""
    return (record.get("turn_id") == request["turn_id"] and record.get("status") == "running"
            and record.get("step", -1) >= request["step"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the engine (what `rig live` prints); by default III_URL")
    parser.add_argument("--swallow", action="store_true", help="swallow finalisation errors (incident 001's bug)")
    args = parser.parse_args()
    name = "python-harness-swallow" if args.swallow else "python-harness"
    host = os.environ.get("RIG_HOST") or "harness"
    worker = register_worker(args.url, InitOptions(worker_name=name))
    harness = Harness(worker, host, args.swallow)
    worker.register_function(f"{host}::turn", harness.turn)
    print(f"{name}: serving {host}::turn at {args.url or os.environ.get('III_URL') or 'the default URL'}", flush=True)
    harness.config()
    # The SDK's event-loop thread keeps the process serving; wait here until it is stopped.
    threading.Event().wait()


if __name__ == "__main__":
    main()

"""A harness worker in Python, on the real iii SDK from PyPI (iii-sdk==0.25.0), for `rig live`.

It serves `harness::turn` as the contract (rig/docs/contract.md) asks of a harness serving turns:
read the turn record, and run model rounds from it until the model answers. A round of tool
calls is planned in the turn record (its actions, under ids of this worker's own, in the
record's `calls`) before any of them runs; each action's intent is recorded before its effect
is requested, its outcome after; an effect whose outcome is unknown is reconciled with its
service (by idempotency key, then by client reference) before it is sent again, and held for a
person when that cannot say; each result goes into the transcript under a key of its action's
own, and the record's `step` advances once the round is settled. A redelivery after a crash
resumes from the record: a round already planned is settled, never asked of the model again,
and a settled action is never sent again.

Finalising records the terminal state (a write whose outcome is unknown is sent once more, then
confirmed by one exact readback), presents it on the session (best effort), and reseeds input
queued meanwhile as a new turn, held when it cannot be enqueued. A finalisation that cannot be
recorded now is retried in the background, as terminalisation only. A write of the record that
fails mid-round ends the delivery with an error: the queue delivers the turn again, and the
redelivery resumes it from what was recorded.

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
import json
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
# An action's statuses: planned (surely not sent), requested (intent recorded, perhaps sent), and
# the record layout's settled ones (rig/docs/contract.md, "The record layout").
PLANNED, REQUESTED, DONE, NOT_DONE, HELD = "planned", "requested", "complete", "failed", "held"
# How often one delivery sends an effect, reconciled in between; how many model rounds a turn may take.
SENDS_MAX = 2
ROUNDS_MAX = 32


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
        for _ in range(ROUNDS_MAX):
            # A round planned before (by a delivery that died mid-round) is settled first.
            if planned_round(record):
                held = self.settle_round(cfg, record)
                if held:
                    return self.hold_turn(request, cfg, record, "; ".join(held))
                record.update(step=record["step"] + 1, updated_at=now_ms())
                self.put_turn(record, cfg)
            try:
                messages = self.call("session::messages", {"session_id": session_id}, cfg["session_timeout_ms"])
            except InvocationError as error:
                return self.fail_turn(request, cfg, f"session::messages: {error}")
            prompt = {"session_id": session_id, "turn_id": record["turn_id"], "step": record["step"],
                      "messages": (messages or {}).get("entries"), "system_prompt": cfg.get("system_prompt", ""),
                      "tools": [{"name": tool["name"], "description": tool.get("description"),
                                 "parameters": tool.get("parameters")} for tool in cfg.get("tools") or []]}
            try:
                reply = self.call("model::generate", prompt, cfg["model_timeout_ms"])
            except InvocationError as error:
                return self.fail_turn(request, cfg, f"model::generate: {error}")
            tool_calls = (reply or {}).get("tool_calls") or []
            if not tool_calls:
                record.update(status="completed", turn_count=record.get("turn_count", 0) + 1, result=reply,
                              updated_at=now_ms())
                return self.close(request, cfg, record)
            self.plan_round(cfg, record, tool_calls)
        return self.fail_turn(request, cfg, f"more than {ROUNDS_MAX} model rounds")

    # Actions: each tool call of a round, kept in the turn record's `calls` under its action id.

    def plan_round(self, cfg, record, tool_calls):
        """Records the round's calls (none sent yet) before any of them runs (settled next, as a resumed round is)."""
        calls = record.setdefault("calls", {})
        for index, call in enumerate(tool_calls):
            action_id = f"py-{uuid.uuid4()}"
            calls[action_id] = {"tool": call.get("tool"), "args": call.get("args") or {}, "call_id": call.get("id"),
                                "step": record["step"], "index": index, "status": PLANNED, "owner": self.host,
                                "idempotency_key": f"key-{uuid.uuid4()}", "client_reference": action_id}
        record["updated_at"] = now_ms()
        self.put_turn(record, cfg)

    def transcribe_calls(self, cfg, record):
        """The round's calls as one assistant entry, keyed: a resumed round's repeat is kept once."""
        content = [{"type": "function_call", "id": action.get("call_id") or action_id,
                    "function_id": action["tool"], "arguments": action["args"]}
                   for action_id, action in planned_round(record)]
        key = f"{record['turn_id']}:{record['step']}:calls"
        self.append(cfg, record, {"role": "assistant", "content": content, "entry_key": key})

    def settle_round(self, cfg, record):
        """Shows the round's calls in the transcript, then brings each to an outcome or a hold; the holds' reasons."""
        self.transcribe_calls(cfg, record)
        held = []
        for action_id, action in planned_round(record):
            self.settle(cfg, record, action_id, action)
            if action["status"] == HELD:
                held.append(f"{action['tool']} ({action_id}): {action['held_reason']}")
        return held

    def settle(self, cfg, record, action_id, action):
        if action["status"] in (DONE, NOT_DONE):
            # Settled by a delivery that may have died before its result reached the transcript.
            return self.transcribe_result(cfg, record, action_id, action)
        if action["status"] == HELD:
            return None
        tool = next((t for t in cfg.get("tools") or [] if t["name"] == action["tool"]), None)
        if tool is None:
            return self.record_outcome(cfg, record, action_id, action, NOT_DONE,
                                       {"error": f"no tool named {action['tool']} is offered"})
        if action["status"] == REQUESTED:
            # Sent before, by a delivery that never recorded the outcome: ask before sending again.
            found, answer = self.reconcile(cfg, tool, action)
            if found is True:
                return self.record_outcome(cfg, record, action_id, action, DONE, answer)
            if found is None:
                return self.hold_action(cfg, record, action, answer)
        return self.request(cfg, record, action_id, action, tool)

    def request(self, cfg, record, action_id, action, tool):
        """Records the intent, then sends the effect; an unanswered request is reconciled before one more try."""
        for _ in range(SENDS_MAX):
            action.update(status=REQUESTED, requested_at_ms=now_ms())
            action.setdefault("first_requested_at_ms", action["requested_at_ms"])
            self.put_turn(record, cfg)
            effect = {"action_id": action_id, "idempotency_key": action["idempotency_key"],
                      "client_reference": action["client_reference"], "args": action["args"]}
            if "title" in action["args"]:
                effect["title"] = action["args"]["title"]
            try:
                answer = self.call(tool["function"], effect, cfg["tool_timeout_ms"])
                return self.record_outcome(cfg, record, action_id, action, DONE, answer)
            except InvocationError as error:
                unknown = error.code in OUTCOME_UNKNOWN
                # A refusal answers one copy of a request the network may deliver twice: the
                # service is asked before the action is taken as not done.
                found, answer = self.reconcile(cfg, tool, action)
                if found is True:
                    return self.record_outcome(cfg, record, action_id, action, DONE, answer)
                if not unknown:
                    return self.record_outcome(cfg, record, action_id, action, NOT_DONE,
                                               {"error": {"code": error.code, "message": str(error)}})
                if found is None:
                    return self.hold_action(cfg, record, action, f"{tool['name']} got no answer ({error}); {answer}")
        return self.hold_action(cfg, record, action, f"{tool['name']} was sent {SENDS_MAX} times without an answer")

    def reconcile(self, cfg, tool, action):
        """Whether the action's effect happened: (True, effect), (False, None), or (None, why not known)."""
        service, why = tool.get("service"), "its service can be asked neither by key nor by reference"
        if tool.get("idempotency"):
            try:
                answer = self.call(f"{service}::status", {"idempotency_key": action["idempotency_key"]},
                                   cfg["tool_timeout_ms"])
                if (answer or {}).get("known"):
                    return True, answer
                first = action.get("first_requested_at_ms") or action.get("requested_at_ms") or 0
                if now_ms() - first < tool.get("idempotency_window_ms", 0):
                    return False, None
                why = f"{service} may have forgotten the key"
            except InvocationError as error:
                why = f"{service}::status: {error}"
        if tool.get("lookup"):
            try:
                answer = self.call(f"{service}::lookup", {"client_reference": action["client_reference"]},
                                   cfg["tool_timeout_ms"])
                return (True, answer) if (answer or {}).get("found") else (False, None)
            except InvocationError as error:
                why = f"{service}::lookup: {error}"
        return None, f"its outcome is unknown: {why}"

    def record_outcome(self, cfg, record, action_id, action, status, answer):
        action.update(status=status, outcome=answer)
        record["updated_at"] = now_ms()
        self.put_turn(record, cfg)
        self.transcribe_result(cfg, record, action_id, action)

    def transcribe_result(self, cfg, record, action_id, action):
        answer = action.get("outcome")
        answer = answer if isinstance(answer, dict) else {"answer": answer}
        # The service's own content when it gives one, else its whole answer as one text block.
        content = answer.get("content") or [{"type": "text", "text": json.dumps(answer, sort_keys=True)}]
        self.append(cfg, record, {"role": "function_result", "function_call_id": action.get("call_id") or action_id,
                                  "function_id": action["tool"], "content": content,
                                  "is_error": action["status"] != DONE or answer.get("is_error") is True,
                                  "entry_key": f"{action_id}:result"})

    def hold_action(self, cfg, record, action, why):
        action.update(status=HELD, held_reason=why)
        record["updated_at"] = now_ms()
        self.put_turn(record, cfg)

    def hold_turn(self, request, cfg, record, why):
        """A turn held for a person: recorded so, and the session's queued input admitted behind it."""
        record.update(status="held", held_reason=why, updated_at=now_ms())
        self.put_turn(record, cfg)
        result = {"session_id": request["session_id"], "turn_id": record["turn_id"], "status": "held",
                  "skipped": False, "next_step": None}
        reseed = self.reseed(cfg, record)
        if reseed is not None:
            result["reseed"] = reseed
        return result

    def append(self, cfg, record, entry):
        """A transcript entry under its key; one the transcript cannot take ends the delivery (raises)."""
        self.call("session::append", {"session_id": record["session_id"], "entry": entry},
                  cfg["session_timeout_ms"])

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
            entry = {"role": "assistant", "text": (terminal.get("result") or {}).get("text"),
                     "entry_key": f"{terminal['turn_id']}:answer"}
            session_status = "idle"
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


def planned_round(record):
    """The actions planned at the record's step, in the model's order."""
    at_step = [(action_id, action) for action_id, action in (record.get("calls") or {}).items()
               if isinstance(action, dict) and action.get("step") == record.get("step")]
    return sorted(at_step, key=lambda item: item[1].get("index", 0))


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

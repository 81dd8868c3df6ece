// @ts-check
/**
 * A harness worker for node, on the real iii SDK from npm (iii-sdk@0.22.1, the newest there),
 * for `rig live`. Plain JavaScript with the SDK's TypeScript types checked by `// @ts-check`:
 * node runs it as it is, with nothing to compile.
 *
 * It serves `harness::turn` as the rig's smoke and finalisation scenarios judge a harness, the
 * same behaviour as `harness_worker.py`: read the turn record, read the session's messages, ask
 * the model, and finalise. Finalising records the terminal state (a write whose outcome is
 * unknown is sent once more, then confirmed by one exact readback), presents it on the session
 * (best effort), and reseeds input queued meanwhile as a new turn, held when it cannot be
 * enqueued. A finalisation that cannot be recorded now is retried in the background, as
 * terminalisation only. Tool calls are not implemented: the model's reply is taken as the
 * turn's result.
 *
 * The run's settings come from `rig::config`, asked at the start of every turn; the worker tells
 * it, as `quiet_after_ms`, the longest it waits by itself between two of its calls. The engine's
 * URL is `--url`, else `III_URL` (which `rig live --spawn` sets), else the SDK's default; the
 * harness host it serves is `RIG_HOST`, else `harness`.
 *
 *     node harness_worker.mjs [--url ws://127.0.0.1:49134]
 */

import { randomUUID } from 'node:crypto'
import { InvocationError, TriggerAction, registerWorker } from 'iii-sdk'

const TURN_SCOPE = 'harness_turn'
const QUEUE_SCOPE = 'harness_queue'
const TERMINAL = ['completed', 'failed', 'cancelled']
const DEFERRED_BACKOFF_MS_MAX = 5_000
const RIG_CONFIG_TIMEOUT_MS = 5_000
// Beyond its longest wait, what scheduling may take on a loaded machine.
const QUIET_SLACK_MS = 250
// Error codes after which a call may still have taken effect.
const OUTCOME_UNKNOWN = ['TIMEOUT', 'invocation_stopped']

/** @typedef {Record<string, any>} Json */

const nowMs = () => Date.now()
const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** @param {unknown} error */
const codeOf = (error) => (error instanceof InvocationError ? error.code : undefined)
/** @param {unknown} error */
const isInvocationError = (error) => error instanceof InvocationError
/** @param {unknown} error */
const outcomeUnknown = (error) => OUTCOME_UNKNOWN.includes(codeOf(error) ?? '')

/** The longest this worker waits by itself between two of its calls: a deferred retry's backoff.
 * @param {Json} cfg */
function quietAfterMs(cfg) {
  const attempts = Math.max(cfg.terminalize_attempts - 1, 0)
  return Math.min(cfg.terminalize_backoff_ms * 2 ** attempts, DEFERRED_BACKOFF_MS_MAX) + QUIET_SLACK_MS
}

/** Whether a delivery is for the turn the record says is running, at or past its step.
 * @param {Json} record @param {Json} request */
function isCurrent(record, request) {
  return record.turn_id === request.turn_id && record.status === 'running' && (record.step ?? -1) >= request.step
}

/** Whether two JSON values are equal, whatever the order of their keys.
 * @param {unknown} a @param {unknown} b @returns {boolean} */
function sameJson(a, b) {
  if (a === b) return true
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false
  if (Array.isArray(a) !== Array.isArray(b)) return false
  const keys = Object.keys(a)
  if (keys.length !== Object.keys(b).length) return false
  return keys.every((key) => sameJson(/** @type {Json} */ (a)[key], /** @type {Json} */ (b)[key]))
}

class Harness {
  /** @param {import('iii-sdk').IIIClient} worker @param {string} host */
  constructor(worker, host) {
    this.worker = worker
    this.host = host
    /** @type {string | undefined} */
    this.declared = undefined
  }

  /** @param {string} functionId @param {Json} payload @param {number} timeoutMs @param {any} [action] */
  call(functionId, payload, timeoutMs, action) {
    return this.worker.trigger({ function_id: functionId, payload, timeoutMs, action })
  }

  /** The run's settings; when they change, the rig is told the longest this worker waits by itself. */
  async config() {
    const answer = await this.call('rig::config', { host: this.host }, RIG_CONFIG_TIMEOUT_MS)
    const quiet = quietAfterMs(answer.config)
    const declaration = `${answer.incarnation}/${quiet}`
    if (this.declared !== declaration) {
      await this.call('rig::config', { host: this.host, quiet_after_ms: quiet }, RIG_CONFIG_TIMEOUT_MS)
      this.declared = declaration
    }
    return answer.config
  }

  /** @param {string} sessionId @param {Json} cfg @returns {Promise<Json | null>} */
  async getTurn(sessionId, cfg) {
    const record = await this.call('state::get', { scope: TURN_SCOPE, key: sessionId }, cfg.session_timeout_ms)
    return record || null
  }

  /** Writes a turn record, once more with the identical record if the outcome is unknown.
   * @param {Json} record @param {Json} cfg */
  async putTurn(record, cfg) {
    const write = { scope: TURN_SCOPE, key: record.session_id, value: record }
    try {
      await this.call('state::set', write, cfg.session_timeout_ms)
    } catch (error) {
      if (!outcomeUnknown(error)) throw error
      await this.call('state::set', write, cfg.session_timeout_ms)
    }
  }

  /** @param {Json} record @param {Json} cfg */
  async putTerminal(record, cfg) {
    try {
      await this.putTurn(record, cfg)
    } catch (error) {
      if (!outcomeUnknown(error)) throw error
      // An unknown outcome does not prove the write is absent: one exact readback.
      let observed
      try {
        observed = await this.getTurn(record.session_id, cfg)
      } catch {
        throw error
      }
      if (!sameJson(observed, record)) throw error
    }
  }

  /** @param {Json} request @param {string} reason */
  skipped(request, reason) {
    return { session_id: request.session_id, turn_id: request.turn_id, status: 'skipped', skipped: true,
             next_step: null, reason }
  }

  /** @param {Json} request */
  async turn(request) {
    const cfg = await this.config()
    const record = await this.getTurn(request.session_id, cfg)
    if (record === null || !isCurrent(record, request)) return this.skipped(request, 'stale')
    const sessionId = request.session_id
    let messages
    try {
      messages = await this.call('session::messages', { session_id: sessionId }, cfg.session_timeout_ms)
    } catch (error) {
      if (!isInvocationError(error)) throw error
      return this.failTurn(request, cfg, `session::messages: ${error}`)
    }
    const prompt = { session_id: sessionId, turn_id: record.turn_id, step: record.step,
                     messages: (messages || {}).entries }
    let reply
    try {
      reply = await this.call('model::generate', prompt, cfg.model_timeout_ms)
    } catch (error) {
      if (!isInvocationError(error)) throw error
      return this.failTurn(request, cfg, `model::generate: ${error}`)
    }
    Object.assign(record, { status: 'completed', turn_count: (record.turn_count ?? 0) + 1, result: reply,
                            updated_at: nowMs() })
    return this.close(request, cfg, record)
  }

  /** @param {Json} request @param {Json} cfg @param {string} cause */
  async failTurn(request, cfg, cause) {
    let record
    try {
      record = await this.getTurn(request.session_id, cfg)
    } catch (error) {
      if (!isInvocationError(error)) throw error
      return this.unfinalized(request, cfg, { cause }, error)
    }
    if (record === null || !isCurrent(record, request)) return this.skipped(request, 'not current')
    Object.assign(record, { status: 'failed', result_error: cause, updated_at: nowMs() })
    return this.close(request, cfg, record)
  }

  /** @param {Json} request @param {Json} cfg @param {Json} terminal */
  async close(request, cfg, terminal) {
    try {
      await this.putTerminal(terminal, cfg)
    } catch (error) {
      if (!isInvocationError(error)) throw error
      return this.unfinalized(request, cfg, { record: terminal }, error)
    }
    return this.afterTerminal(cfg, terminal)
  }

  /** What the caller hears when the terminal state could not be recorded now.
   * @param {Json} request @param {Json} cfg @param {Json} intent @param {unknown} error */
  unfinalized(request, cfg, intent, error) {
    void this.terminalizeLater(request, cfg, intent)
    const status = intent.record ? intent.record.status : 'failed'
    return { session_id: request.session_id, turn_id: request.turn_id, status, skipped: false, next_step: null,
             finalized: false, reason: `terminal state not yet recorded: ${error}` }
  }

  /** Retries finalisation as terminalisation only; never re-runs the model.
   * @param {Json} request @param {Json} cfg @param {Json} intent */
  async terminalizeLater(request, cfg, intent) {
    const status = intent.record ? intent.record.status : 'failed'
    for (let attempt = 1; attempt <= cfg.terminalize_attempts; attempt++) {
      await sleep(Math.min(cfg.terminalize_backoff_ms * 2 ** (attempt - 1), DEFERRED_BACKOFF_MS_MAX))
      let record
      try {
        record = await this.getTurn(request.session_id, cfg)
      } catch {
        continue
      }
      if (record === null) return
      if (record.turn_id === request.turn_id && TERMINAL.includes(record.status)) {
        // The write landed though its acknowledgement did not.
        if (record.status === status) await this.afterTerminal(cfg, record)
        return
      }
      if (!isCurrent(record, request)) return
      const terminal = intent.record ??
        { ...record, status: 'failed', result_error: intent.cause, updated_at: nowMs() }
      try {
        await this.putTerminal(terminal, cfg)
      } catch {
        continue
      }
      await this.afterTerminal(cfg, terminal)
      return
    }
  }

  /** Presentation (best effort: the durable record already says what happened), then reseeding.
   * @param {Json} cfg @param {Json} terminal */
  async afterTerminal(cfg, terminal) {
    const sessionId = terminal.session_id
    const timeout = cfg.session_timeout_ms
    const [entry, sessionStatus] = terminal.status === 'completed'
      ? [{ role: 'assistant', text: (terminal.result || {}).text }, 'idle']
      : [{ role: 'system', kind: 'error', text: terminal.result_error }, 'error']
    for (const [functionId, payload] of [['session::append', { session_id: sessionId, entry }],
                                         ['session::set-status', { session_id: sessionId, status: sessionStatus }]]) {
      try {
        await this.call(/** @type {string} */ (functionId), /** @type {Json} */ (payload), timeout)
      } catch (error) {
        if (!isInvocationError(error)) throw error
      }
    }
    /** @type {Json} */
    const result = { session_id: sessionId, turn_id: terminal.turn_id, status: terminal.status, skipped: false,
                     next_step: null }
    const reseed = await this.reseed(cfg, terminal)
    if (reseed !== null) result.reseed = reseed
    return result
  }

  /** Moves input queued for the session into a new turn and enqueues it; holds it when it cannot.
   * @param {Json} cfg @param {Json} predecessor */
  async reseed(cfg, predecessor) {
    const timeout = cfg.session_timeout_ms
    const sessionId = predecessor.session_id
    let listed
    try {
      listed = (await this.call('state::list', { scope: QUEUE_SCOPE }, timeout)) || []
    } catch (error) {
      if (!isInvocationError(error)) throw error
      return { admitted: false, error: String(error) }
    }
    const queued = listed.filter((/** @type {Json} */ entry) => entry.value.session_id === sessionId)
    if (queued.length === 0) return null
    const turnId = `t-${randomUUID()}`
    const turn = { session_id: sessionId, turn_id: turnId, status: 'running', step: 0, turn_count: 0, depth: 0,
                   abort: false, calls: {}, input: queued.map((/** @type {Json} */ e) => e.value.message),
                   created_at: nowMs(), updated_at: nowMs() }
    try {
      await this.putTurn(turn, cfg)
    } catch (error) {
      if (!isInvocationError(error)) throw error
      return { admitted: false, error: String(error) }
    }
    for (const entry of queued) {
      try {
        await this.call('state::delete', { scope: QUEUE_SCOPE, key: entry.key }, timeout)
      } catch (error) {
        if (!isInvocationError(error)) throw error
      }
    }
    const request = { session_id: sessionId, turn_id: turnId, step: 0, depth: 0 }
    const attempts = cfg.enqueue_attempts
    let lastError = ''
    for (let attempt = 1; attempt <= attempts; attempt++) {
      try {
        await this.call(`${this.host}::turn`, request, timeout, TriggerAction.Enqueue({ queue: cfg.turn_queue }))
        return { turn_id: turnId, admitted: true, attempts: attempt }
      } catch (error) {
        if (!isInvocationError(error)) throw error
        lastError = String(error)
      }
    }
    Object.assign(turn, { status: 'held', held_reason: `enqueue exhausted after ${attempts} attempts: ${lastError}`,
                          updated_at: nowMs() })
    let held = true
    try {
      await this.putTurn(turn, cfg)
    } catch (error) {
      if (!isInvocationError(error)) throw error
      held = false
    }
    return { turn_id: turnId, admitted: false, attempts, error: lastError, held }
  }
}

function main() {
  const flag = process.argv.indexOf('--url')
  const url = (flag >= 0 ? process.argv[flag + 1] : undefined) || process.env.III_URL || 'ws://127.0.0.1:49134'
  const host = process.env.RIG_HOST || 'harness'
  const worker = registerWorker(url, { workerName: 'node-harness' })
  const harness = new Harness(worker, host)
  worker.registerFunction(`${host}::turn`, (request) => harness.turn(request))
  console.log(`node-harness: serving ${host}::turn at ${url}`)
  harness.config().catch((error) => console.error(`node-harness: rig::config: ${error}`))
}

main()

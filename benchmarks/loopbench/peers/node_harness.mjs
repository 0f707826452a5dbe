// Drives the deterministic loop detectors of Gemini CLI and Qwen Code over loopbench episodes.
//
// Usage: node node_harness.mjs EPISODES.jsonl > flags.jsonl  (after `npm install` in this folder)
// Prints one JSON line per episode: {"id", "gemini", "qwen", "openclaw_warn", "openclaw_block"},
// each the first step (assistant messages counted from 1) at which that detector fired, or null;
// "unavailable" when the package is not installed.
//
// How each CLI uses its service, reproduced here: reset(promptId) when a new user prompt starts
// (tool results continue the same prompt), then addAndCheck() on every stream event — one
// ToolCallRequest per tool call, Content events for the answer text (fed line by line, as a
// stream delivers it). Thought (reasoning) events are not checked by either service. The
// LLM-based check (turnStarted) is never called: only the deterministic detectors run, and the
// config stub turns telemetry off.
//
// OpenClaw (its npm tarball unpacked into ./openclaw, see the nox session): the agent runtime
// calls detectToolCallLoop() before every tool call (a "warning" result is a hint to the model, a
// "critical" one blocks the call), recordToolCall() when it runs, and recordToolCallOutcome()
// with the result (a tool message starting with "Error" is passed as the error). Loop detection
// is opt-in there (tools.loopDetection.enabled); it is enabled with its default thresholds.
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const here = dirname(fileURLToPath(import.meta.url));
const mod = (pkg) =>
  join(here, 'node_modules', pkg, 'dist', 'src', 'services', 'loopDetectionService.js');

// a Config stand-in: loop detection on, every telemetry and usage switch off
const config = new Proxy(
  {
    getDisableLoopDetection: () => false,
    getUsageStatisticsEnabled: () => false,
    getTelemetryEnabled: () => false,
    getDebugMode: () => false,
    getSessionId: () => 'loopbench',
    getContentGeneratorConfig: () => ({}),
  },
  { get: (target, key) => (key in target ? target[key] : () => undefined) },
);

async function load(pkg, makeContext) {
  try {
    const { LoopDetectionService } = await import(mod(pkg));
    return () => new LoopDetectionService(makeContext());
  } catch (err) {
    process.stderr.write(`${pkg}: ${err.message}\n`);
    return null;
  }
}

async function loadOpenClaw() {
  try {
    const dist = join(here, 'openclaw', 'dist');
    const file = readdirSync(dist).find((f) => /^tool-loop-detection-[\w-]+\.mjs$/.test(f) && !f.includes('config'));
    const exported = Object.values(await import(join(dist, file)));
    const fn = (name) => exported.find((f) => typeof f === 'function' && f.name === name);
    const api = {
      detect: fn('detectToolCallLoop'),
      record: fn('recordToolCall'),
      outcome: fn('recordToolCallOutcome'),
    };
    if (!api.detect || !api.record || !api.outcome) throw new Error('API not found');
    return api;
  } catch (err) {
    process.stderr.write(`openclaw: ${err.message}\n`);
    return null;
  }
}

const openclaw = await loadOpenClaw();

function openclawFlags(messages) {
  const state = { toolCallHistory: [] };
  const config = { enabled: true };
  const pending = new Map();
  let step = 0;
  let warn = null;
  let block = null;
  for (const m of messages) {
    if (m.role === 'assistant') {
      step += 1;
      for (const call of m.tool_calls ?? []) {
        const name = call.function.name;
        const params = args(call.function.arguments);
        const verdict = openclaw.detect(state, name, params, config);
        if (verdict.stuck) {
          warn ??= step;
          if (verdict.level === 'critical') block ??= step;
        }
        openclaw.record(state, name, params, call.id);
        pending.set(call.id, [name, params]);
      }
    } else if (m.role === 'tool' && pending.has(m.tool_call_id)) {
      const [toolName, toolParams] = pending.get(m.tool_call_id);
      pending.delete(m.tool_call_id);
      const text = typeof m.content === 'string' ? m.content : JSON.stringify(m.content ?? '');
      const outcome = { toolName, toolParams, toolCallId: m.tool_call_id };
      if (text.startsWith('Error')) outcome.error = text;
      else outcome.result = { content: [{ type: 'text', text }], details: {} };
      openclaw.outcome(state, outcome);
    }
  }
  return [warn, block];
}

const peers = {
  gemini: await load('@google/gemini-cli-core', () => ({ config })),
  qwen: await load('@qwen-code/qwen-code-core', () => config),
};

function chunks(text) {
  return text.match(/[^\n]*\n|[^\n]+$/g) ?? [];
}

function args(raw) {
  if (typeof raw !== 'string') return raw ?? {};
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

function firstFlag(make, messages) {
  const service = make();
  let step = 0;
  let prompt = 0;
  service.reset(`p${prompt}`);
  for (const m of messages) {
    if (m.role === 'user') {
      prompt += 1;
      service.reset(`p${prompt}`);
      continue;
    }
    if (m.role !== 'assistant') continue;
    step += 1;
    const text = typeof m.content === 'string' ? m.content : '';
    for (const piece of chunks(text)) {
      const r = service.addAndCheck({ type: 'content', value: piece });
      if (r === true || (r && r.count > 0)) return step;
    }
    for (const call of m.tool_calls ?? []) {
      const value = {
        callId: call.id,
        name: call.function.name,
        args: args(call.function.arguments),
        isClientInitiated: false,
        prompt_id: `p${prompt}`,
      };
      const r = service.addAndCheck({ type: 'tool_call_request', value });
      if (r === true || (r && r.count > 0)) return step;
    }
  }
  return null;
}

const lines = readFileSync(process.argv[2], 'utf8').split('\n').filter(Boolean);
for (const line of lines) {
  const ep = JSON.parse(line);
  const out = { id: ep.id };
  for (const [name, make] of Object.entries(peers)) {
    out[name] = make ? firstFlag(make, ep.messages) : 'unavailable';
  }
  if (openclaw) [out.openclaw_warn, out.openclaw_block] = openclawFlags(ep.messages);
  else out.openclaw_warn = out.openclaw_block = 'unavailable';
  process.stdout.write(JSON.stringify(out) + '\n');
}

// The dynamic-cache baseline run by transformers.js itself (its DynamicCache: fresh present tensors every step).
//
// Contract: loadTransformers(ortUrl, sourceText) imports transformers.js's browser build with its two bare
// imports ("onnxruntime-web/webgpu", "onnxruntime-common") pointed at ortUrl, the very module kvlab's own runs
// use, so both share one onnxruntime-web instance, one env and one (counted) GPUDevice. Call it after
// ort.env.wasm.wasmPaths is set (transformers.js points an unset one at a CDN when it loads).
// generateWithTransformers({tjs, job, bytes, counters, ep, cancelled}) loads the kvlab model from memory (a custom cache
// answers every file transformers.js asks for; nothing is fetched), generates job.max_new_tokens greedy tokens
// (no stop on EOS) and returns {tokens, steps} in the shape decode.mjs returns. A step is one session.run of
// transformers.js: run_ms is performance.now around that run, wall_ms from its start to the next run's start
// (the last: to generate()'s end), gpu the device's buffer counters over the same span. When cancelled() answers
// true before a run, it frees the last run's outputs (the pasts transformers.js holds) and throws an Error named
// 'Cancelled' (the model disposed after).

import { cacheBytes, countFresh } from './caches.mjs';
import { checkCancelled, record } from './decode.mjs';

export async function loadTransformers(ortUrl, sourceText) {
  const patched = sourceText
    .replaceAll('from"onnxruntime-web/webgpu"', `from"${ortUrl}"`)
    .replaceAll('from"onnxruntime-common"', `from"${ortUrl}"`);
  if (patched.includes('"onnxruntime-web/webgpu"') || patched.includes('"onnxruntime-common"')) {
    throw new Error('transformers.js imports onnxruntime-web in a form this runner does not rewrite');
  }
  const url = URL.createObjectURL(new Blob([patched], { type: 'text/javascript' }));
  try {
    return await import(url);
  } finally {
    URL.revokeObjectURL(url);
  }
}

function modelCache(job, bytes) {
  const model = job.model;
  const files = {
    'config.json': new TextEncoder().encode(JSON.stringify(model.transformers_config)),
    'generation_config.json': new TextEncoder().encode('{}'),
  };
  // the decoder with concrete past shapes (kvlab/web/job.py: concrete_past_shapes), under the name transformers.js asks for
  files[`onnx/${model.files[0].name}`] = bytes[model.transformers_graph?.name ?? model.files[0].name];
  for (const f of model.files.slice(1)) files[`onnx/${f.name}`] = bytes[f.name];
  return {
    async match(request) {
      const key = typeof request === 'string' ? request : request.url;
      const hit = Object.keys(files).find((name) => key.endsWith(`/${model.name}/${name}`));
      return hit ? new Response(files[hit], { headers: { 'content-length': String(files[hit].byteLength) } }) : undefined;
    },
    async put() {},
  };
}

export async function generateWithTransformers({ tjs, job, bytes, counters, ep, cancelled }) {
  const { AutoModelForCausalLM, env, Tensor } = tjs;
  env.allowLocalModels = true;
  env.allowRemoteModels = false;
  env.useBrowserCache = false;
  env.useWasmCache = false;
  env.useCustomCache = true;
  env.customCache = modelCache(job, bytes);
  env.localModelPath = '/kvlab-transformers-js/';
  const model = job.model;
  const externalData = model.files.slice(1).map((f) => ({ path: f.name, data: `onnx/${f.name}` }));
  const lm = await AutoModelForCausalLM.from_pretrained(model.name, {
    device: 'webgpu',
    dtype: model.dtype === 'float16' ? 'fp16' : 'fp32',
    local_files_only: true,
    session_options: { executionProviders: [ep], ...(externalData.length ? { externalData } : {}) },
  });
  const session = lm.sessions.model;
  const run = session.run.bind(session);
  const spans = [];
  const seen = new WeakSet();
  let last = null; // the latest run's outputs: transformers.js's next pasts, which a cancel must free itself
  session.run = async (feeds, ...rest) => {
    if (cancelled?.()) {
      for (const t of Object.values(last ?? {})) t.dispose?.(); // a tensor's dispose() frees its buffer once
      checkCancelled(cancelled);
    }
    const span = { start: performance.now(), before: counters.snapshot() };
    spans.push(span);
    const outputs = await run(feeds, ...rest);
    last = outputs;
    span.end = performance.now();
    // read now: transformers.js disposes these tensors a step later
    const presents = model.entries.map((e) => outputs[e.present]).filter(Boolean);
    span.tensors = presents.length;
    span.fresh = countFresh(presents, seen);
    return outputs;
  };
  try {
    const n = job.prompt_ids.length;
    const ids = BigInt64Array.from(job.prompt_ids, (v) => BigInt(v));
    const input_ids = new Tensor('int64', ids, [1, n]);
    const attention_mask = new Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]);
    const out = await lm.generate({
      input_ids,
      attention_mask,
      max_new_tokens: job.max_new_tokens,
      do_sample: false,
      eos_token_id: [],
    });
    const finished = { start: performance.now(), before: counters.snapshot() }; // where the last step ends
    const sequence = Array.from(out.data, Number);
    const tokens = sequence.slice(n);
    return { tokens, steps: stepsOf(spans, finished, tokens, n, model, counters), session };
  } finally {
    await lm.dispose();
  }
}

function stepsOf(spans, finished, tokens, n, model, counters) {
  return spans.map((span, i) => {
    const next = spans[i + 1] ?? finished;
    const gpu = counters.delta(span.before, next.before);
    const position = i === 0 ? 0 : n + i - 1;
    const length = i === 0 ? n : 1;
    const bytes = cacheBytes(model, position + length);
    const memory = { tensors: span.tensors, bytes, new_buffers: span.fresh, live_bytes: bytes };
    return record(i, position, length, tokens[i], { wall: next.start - span.start, run: span.end - span.start }, memory, gpu, 0);
  });
}

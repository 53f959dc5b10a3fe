// One greedy generation through one cache: the prefill, then one token per step; one record per step.
//
// Contract: decode({ort, session, model, cache, promptIds, maxNewTokens, counters, onStep}) runs
// maxNewTokens steps (no stop on EOS: the caller compares tokens step by step) and returns
// {tokens, steps}. Each step record holds: step (0 = prefill), phase, position (cache length before the step),
// n_tokens, token (argmax of the last position's logits, first index on ties, as numpy's argmax),
// wall_ms (performance.now around the whole step: feeds, run, reading the logits, choosing the token, the
// cache's commit), run_ms (performance.now around session.run alone), the cache's own accounting (tensors,
// bytes, new_buffers, live_bytes) and gpu: the exact GPU buffer counters of the device over the step
// (counters.delta). The caller owns the cache (and releases it).

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const f = h & 0x3ff;
  if (e === 0) return s * 2 ** -14 * (f / 1024);
  if (e === 31) return f ? NaN : s * Infinity;
  return s * 2 ** (e - 15) * (1 + f / 1024);
}

export function argmaxLast(logits) {
  const vocab = logits.dims[logits.dims.length - 1];
  const data = logits.data;
  const start = data.length - vocab;
  const half = data instanceof Uint16Array;
  let best = 0;
  let bestValue = -Infinity;
  for (let i = 0; i < vocab; i += 1) {
    const v = half ? halfToFloat(data[start + i]) : Number(data[start + i]);
    if (v > bestValue) {
      bestValue = v;
      best = i;
    }
  }
  return best;
}

function int64(ort, values, dims) {
  return new ort.Tensor('int64', BigInt64Array.from(values, (v) => BigInt(v)), dims);
}

export async function decode({ ort, session, model, cache, promptIds, maxNewTokens, counters, onStep }) {
  const tokens = [];
  const steps = [];
  let position = 0;
  let feed = promptIds;
  for (let step = 0; step < maxNewTokens; step += 1) {
    const before = counters.snapshot();
    const t0 = performance.now();
    const n = feed.length;
    const feeds = {
      [model.input_ids]: int64(ort, feed, [1, n]),
      [model.attention_mask]: int64(ort, new Array(position + n).fill(1), [1, position + n]),
      ...cache.feeds(position, n),
    };
    if (model.position_ids) {
      feeds[model.position_ids] = int64(ort, feed.map((_, i) => position + i), [1, n]);
    }
    const fetches = cache.fetches();
    if (fetches) fetches[model.logits] = null;
    const t1 = performance.now();
    const outputs = fetches ? await session.run(feeds, fetches) : await session.run(feeds);
    const t2 = performance.now();
    const token = argmaxLast(outputs[model.logits]);
    outputs[model.logits].dispose();
    const memory = cache.commit(outputs, n);
    const t3 = performance.now();
    const gpu = counters.delta(before, counters.snapshot());
    const record = {
      step,
      phase: step === 0 ? 'prefill' : 'decode',
      position,
      n_tokens: n,
      token,
      wall_ms: t3 - t0,
      run_ms: t2 - t1,
      cache_tensors_allocated: memory.tensors,
      cache_bytes_allocated: memory.bytes,
      new_buffers: memory.new_buffers,
      live_cache_bytes: memory.live_bytes,
      gpu,
    };
    steps.push(record);
    tokens.push(token);
    if (onStep) onStep(record);
    position += n;
    feed = [token];
  }
  return { tokens, steps };
}

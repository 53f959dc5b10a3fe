// One greedy generation through one cache: the prefill, then one token per step; one record per step.
//
// Contract: decode({ort, device, session, model, cache, promptIds, maxNewTokens, counters, onStep, greedy,
// tokensPerRead, stopTokens, cancelled}) runs up to maxNewTokens steps and returns {tokens, steps}; it ends
// early after the first token of stopTokens (none: never). Two ways to choose the token:
// - greedy null (the host path): every step downloads the logits and takes their argmax here (argmaxLast:
//   the last position's, first index on ties, as numpy's argmax); each token is read on its own (read_with 0).
// - greedy (job.model.greedy: the session runs kvlab's greedy graph, whose output greedy.next is the argmax made
//   inside the model): the token stays on the GPU. TokenRing holds it: the prefill's token is read at once, then
//   the decode runs in bursts of up to tokensPerRead steps, step k of a burst reading its input ids from the ring
//   tensor step k - 1 wrote; one mapAsync at the burst's end reads the burst's tokens. Steps a burst ran past a
//   stop token are undone (not reported; the generation ends there), as the native burst does. A token outside
//   the vocabulary (the graph's non-finite check) ends the run with an error naming the step and position.
// Each step record holds: step (0 = prefill), phase, position (cache length before the step), n_tokens, token,
// wall_ms (performance.now around the whole step: feeds, run, choosing or reading the token, the cache's commit;
// in a burst, the burst's time, its read included, shared out equally), run_ms (session.run alone; in a burst, the
// burst's mean), read_with (the steps whose tokens were read together, this one among them; 0 for a token read on
// its own), the cache's own accounting (tensors, bytes, new_buffers, live_bytes) and gpu: the exact GPU buffer
// counters of the device over the step (counters.delta; a burst's read counted in its last step). cancelled()
// is asked before every step; when it answers true decode throws an Error named 'Cancelled'. The caller owns the
// cache (and releases it); the ring is released here, exactly once, also on error.

export function halfToFloat(h) {
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

export function int64(ort, values, dims) {
  return new ort.Tensor('int64', BigInt64Array.from(values, (v) => BigInt(v)), dims);
}

export function ids(ort, dtype, values) {
  if (dtype === 'int32') return new ort.Tensor('int32', Int32Array.from(values), [1, values.length]);
  return int64(ort, values, [1, values.length]);
}

export const TOKEN_USAGE = 0x80 | 0x4 | 0x8; // STORAGE | COPY_SRC | COPY_DST
export const READ_USAGE = 0x1 | 0x8; // MAP_READ | COPY_DST

// The greedy token kept on the GPU: a ring of `size` [1, 1] tensors of the graph's id type, one buffer each, and
// one staging buffer a burst's tokens are copied into and mapped from. tensor(k): k places after the current one
// (the last token read); read(k) copies tensors 1..k into the staging buffer and maps it once; advance(k) moves
// current over them. All buffers are made at once (none, if one fails) and destroyed by release(), once.
export class TokenRing {
  constructor(ort, device, dtype, size) {
    this.device = device;
    this.dtype = dtype;
    this.bytes = dtype === 'int32' ? 4 : 8;
    this.buffers = [];
    try {
      for (let i = 0; i < size; i += 1) this.buffers.push(device.createBuffer({ size: 16, usage: TOKEN_USAGE }));
      this.staging = device.createBuffer({ size: Math.max(16, size * this.bytes), usage: READ_USAGE });
    } catch (err) {
      for (const b of this.buffers) b.destroy();
      throw err;
    }
    this.tensors = this.buffers.map((b) => ort.Tensor.fromGpuBuffer(b, { dataType: dtype, dims: [1, 1] }));
    this.current = 0;
  }

  get burstLimit() {
    return this.tensors.length - 1;
  }

  tensor(ahead) {
    return this.tensors[(this.current + ahead) % this.tensors.length];
  }

  async read(k) {
    const encoder = this.device.createCommandEncoder();
    for (let j = 1; j <= k; j += 1) {
      encoder.copyBufferToBuffer(this.tensor(j).gpuBuffer, 0, this.staging, (j - 1) * this.bytes, this.bytes);
    }
    this.device.queue.submit([encoder.finish()]);
    await this.staging.mapAsync(1, 0, k * this.bytes); // GPUMapMode.READ
    const range = this.staging.getMappedRange(0, k * this.bytes).slice(0);
    this.staging.unmap();
    const values = this.dtype === 'int32' ? new Int32Array(range) : new BigInt64Array(range);
    return Array.from(values, Number);
  }

  advance(k) {
    this.current = (this.current + k) % this.tensors.length;
  }

  release() {
    if (!this.buffers) return;
    for (const b of this.buffers) b.destroy();
    this.staging.destroy();
    this.buffers = null;
    this.tensors = null;
  }
}

export function checkCancelled(cancelled) {
  if (cancelled && cancelled()) {
    const err = new Error('cancelled: the run was stopped before it finished; its buffers were released');
    err.name = 'Cancelled';
    throw err;
  }
}

// the feeds of one step: ids (a tensor), the attention mask over every position, position ids where the graph has
// them, the cache's pasts
function stepFeeds(ort, model, cache, idsTensor, position, n) {
  const feeds = {
    [model.input_ids]: idsTensor,
    [model.attention_mask]: int64(ort, new Array(position + n).fill(1), [1, position + n]),
    ...cache.feeds(position, n),
  };
  if (model.position_ids) {
    feeds[model.position_ids] = int64(
      ort,
      Array.from({ length: n }, (_, i) => position + i),
      [1, n],
    );
  }
  return feeds;
}

export function record(step, position, n, token, times, memory, gpu, readWith) {
  return {
    step,
    phase: step === 0 ? 'prefill' : 'decode',
    position,
    n_tokens: n,
    token,
    wall_ms: times.wall,
    run_ms: times.run,
    read_with: readWith,
    cache_tensors_allocated: memory.tensors,
    cache_bytes_allocated: memory.bytes,
    new_buffers: memory.new_buffers,
    live_cache_bytes: memory.live_bytes,
    gpu,
  };
}

export async function decode(args) {
  return args.greedy ? decodeOnDevice(args) : decodeOnHost(args);
}

async function decodeOnHost({ ort, session, model, cache, promptIds, maxNewTokens, counters, onStep, stopTokens, cancelled }) {
  const tokens = [];
  const steps = [];
  const stop = new Set(stopTokens ?? []);
  let position = 0;
  let feed = promptIds;
  for (let step = 0; step < maxNewTokens && !stop.has(tokens[tokens.length - 1]); step += 1) {
    checkCancelled(cancelled);
    const before = counters.snapshot();
    const t0 = performance.now();
    const n = feed.length;
    const feeds = stepFeeds(ort, model, cache, ids(ort, 'int64', feed), position, n);
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
    const r = record(step, position, n, token, { wall: t3 - t0, run: t2 - t1 }, memory, gpu, 0);
    steps.push(r);
    tokens.push(token);
    if (onStep) onStep(r);
    position += n;
    feed = [token];
  }
  return { tokens, steps };
}

// one run of the greedy graph: input ids from idsTensor, the token written into ring tensor `ahead`
async function runGreedy({ ort, session, model, cache, greedy, counters }, ring, idsTensor, position, n, ahead) {
  const before = counters.snapshot();
  const feeds = stepFeeds(ort, model, cache, idsTensor, position, n);
  const fetches = cache.fetches() ?? {};
  for (const e of model.entries) if (!(e.present in fetches)) fetches[e.present] = null;
  fetches[greedy.next] = ring.tensor(ahead);
  const t1 = performance.now();
  const outputs = await session.run(feeds, fetches);
  const run = performance.now() - t1;
  const memory = cache.commit(outputs, n);
  return { position, n, run, memory, before };
}

export function notAToken(token, model, step, position) {
  if (token >= 0 && token < model.vocab_size) return;
  throw new Error(
    `model ${model.name} gave non-finite logits at step ${step} (position ${position}): NaN or Inf; its weights ` +
      'or its arithmetic (float16 overflow?) are broken, so no token can be chosen',
  );
}

// a burst's tokens read back (values, after the counters snapshot `read`): checked, the steps up to the first stop
// token recorded (wall time shared out, run time the burst's mean, the read counted in the last step), the rest
// undone; state: {steps, tokens, stop, model, onStep, counters}, extended in place
export function reportBurst(state, burst, values, start, read) {
  const k = burst.length;
  const readDelta = state.counters.delta(read, state.counters.snapshot());
  const last = burst[k - 1].gpu;
  for (const key of Object.keys(readDelta)) {
    last[key] = key.startsWith('live') ? readDelta[key] : last[key] + readDelta[key];
  }
  const wall = (performance.now() - start) / k;
  const run = burst.reduce((sum, s) => sum + s.run, 0) / k;
  values.forEach((t, i) => notAToken(t, state.model, state.steps.length + i, burst[i].position));
  const stopAt = values.findIndex((t) => state.stop.has(t));
  const kept = stopAt < 0 ? k : stopAt + 1; // the steps after a stop token: undone, never reported
  for (let i = 0; i < kept; i += 1) {
    const s = burst[i];
    const rec = record(state.steps.length, s.position, 1, values[i], { wall, run }, s.memory, s.gpu, k);
    state.steps.push(rec);
    state.tokens.push(values[i]);
    if (state.onStep) state.onStep(rec);
  }
}

async function decodeOnDevice(args) {
  const { ort, device, model, promptIds, maxNewTokens, counters, onStep, greedy, cancelled } = args;
  const stop = new Set(args.stopTokens ?? []);
  const perRead = Math.max(1, args.tokensPerRead ?? 1);
  const tokens = [];
  const steps = [];
  checkCancelled(cancelled);
  const t0 = performance.now();
  const first = counters.snapshot();
  const ring = new TokenRing(ort, device, greedy.ids_dtype, perRead + 1);
  try {
    // the prefill: its token read at once
    const ran = await runGreedy(args, ring, ids(ort, greedy.ids_dtype, promptIds), 0, promptIds.length, 1);
    const [token] = await ring.read(1);
    notAToken(token, model, 0, 0);
    ring.advance(1);
    const wall = performance.now() - t0;
    const gpu = counters.delta(first, counters.snapshot());
    const r = record(0, 0, ran.n, token, { wall, run: ran.run }, ran.memory, gpu, 0);
    steps.push(r);
    tokens.push(token);
    if (onStep) onStep(r);
    let position = ran.n;
    while (tokens.length < maxNewTokens && !stop.has(tokens[tokens.length - 1])) {
      const k = Math.min(perRead, maxNewTokens - tokens.length, ring.burstLimit);
      const start = performance.now();
      const burst = [];
      for (let ahead = 1; ahead <= k; ahead += 1) {
        checkCancelled(cancelled);
        const one = await runGreedy(args, ring, ring.tensor(ahead - 1), position, 1, ahead);
        one.gpu = counters.delta(one.before, counters.snapshot());
        burst.push(one);
        position += 1;
      }
      const read = counters.snapshot();
      const values = await ring.read(k);
      reportBurst({ steps, tokens, stop, model, onStep, counters }, burst, values, start, read);
      ring.advance(k);
    }
  } finally {
    ring.release();
  }
  return { tokens, steps };
}

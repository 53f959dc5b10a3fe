// One greedy generation through one cache: the prefill, then one token per step; one record per step.
//
// Contract: decode({ort, device, session, job, cache, counters, onStep, cancelled}) runs up to job.max_new_tokens
// steps after job.prompt_ids and returns {tokens, steps}; it ends early after the first token of job.stop_tokens.
// The token is chosen on the host (job.model.greedy null: every step's logits downloaded, argmaxLast) or stays on
// the GPU (greedy: kvlab's greedy graph writes it into a TokenRing; the decode runs in bursts of up to
// job.tokens_per_read steps read back with one mapAsync; steps a burst ran past a stop token are undone, as
// natively). A token outside the vocabulary ends the run with an error naming the step and position.
// Each step record holds: step (0 = prefill), phase, position (cache length before the step), n_tokens, token,
// wall_ms (the whole step; in a burst, the burst's time, its read included, shared out equally), run_ms
// (session.run alone; in a burst, the burst's mean), read_with (the steps whose tokens were read together; 0 for a
// token read on its own), the cache's accounting (tensors, bytes, new_buffers, live_bytes) and gpu (counters.delta
// over the step; a burst's read counted in its last step). cancelled() is asked before every step; true: an Error
// named 'Cancelled'. The caller owns the cache; the ring is released here, exactly once, also on error.

import { createBuffers } from './caches.mjs';

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

// each [from, to, offset, bytes] of moves: `bytes` bytes of buffer from copied to buffer to at offset, one submit
export function copyBuffers(device, moves) {
  const encoder = device.createCommandEncoder();
  for (const [from, to, offset, bytes] of moves) encoder.copyBufferToBuffer(from, 0, to, offset, bytes);
  device.queue.submit([encoder.finish()]);
}

// the first `bytes` bytes of a MAP_READ buffer: one mapAsync
export async function mapRead(staging, bytes) {
  await staging.mapAsync(1, 0, bytes); // GPUMapMode.READ
  const range = staging.getMappedRange(0, bytes).slice(0);
  staging.unmap();
  return range;
}

// a burst's k tokens of type dtype, read from the staging buffer they were copied into
export async function mapTokens(staging, k, dtype) {
  const range = await mapRead(staging, k * (dtype === 'int32' ? 4 : 8));
  return Array.from(dtype === 'int32' ? new Int32Array(range) : new BigInt64Array(range), Number);
}

// The greedy token kept on the GPU: a ring of `size` [1, 1] id tensors and one staging buffer. tensor(k): k places
// after the last token read; read(k) reads tensors 1..k with one map and moves over them. release(): once.
export class TokenRing {
  constructor(ort, device, dtype, size) {
    this.device = device;
    this.dtype = dtype;
    this.bytes = dtype === 'int32' ? 4 : 8;
    const specs = [...new Array(size).fill([16, TOKEN_USAGE]), [Math.max(16, size * this.bytes), READ_USAGE]];
    this.buffers = createBuffers(device, specs);
    this.staging = this.buffers.pop();
    this.tensors = this.buffers.map((b) => ort.Tensor.fromGpuBuffer(b, { dataType: dtype, dims: [1, 1] }));
    this.current = 0;
  }

  tensor(ahead) {
    return this.tensors[(this.current + ahead) % this.tensors.length];
  }

  async read(k) {
    copyBuffers(
      this.device,
      Array.from({ length: k }, (_, j) => [this.tensor(j + 1).gpuBuffer, this.staging, j * this.bytes, this.bytes]),
    );
    const values = await mapTokens(this.staging, k, this.dtype);
    this.current = (this.current + k) % this.tensors.length;
    return values;
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

// session.run(feeds, fetches) (fetches may be undefined: every output) and its time in ms: [outputs, ms]
export async function timedRun(session, feeds, fetches) {
  const t = performance.now();
  const outputs = await session.run(feeds, fetches);
  return [outputs, performance.now() - t];
}

// the feeds of one step: ids (a tensor), the mask, position ids where the graph has them, the cache's pasts
export function stepFeeds(ort, model, cache, idsTensor, position, n) {
  const feeds = {
    [model.input_ids]: idsTensor,
    [model.attention_mask]: int64(ort, new Array(position + n).fill(1), [1, position + n]),
    ...cache.feeds(position, n),
  };
  if (model.position_ids) {
    feeds[model.position_ids] = int64(ort, Array.from({ length: n }, (_, i) => position + i), [1, n]);
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
  return args.job.model.greedy ? decodeOnDevice(args) : decodeOnHost(args);
}

// the host path: every step's logits downloaded and their argmax taken here, each token on its own (read_with 0)
function decodeOnHost(args) {
  const { ort, session, job, cache } = args;
  const { model } = job;
  return decodeWith(args, 1, () => {
    let token = null;
    const run = async (feed, position) => {
      const feeds = stepFeeds(ort, model, cache, ids(ort, 'int64', feed), position, feed.length);
      const fetches = cache.fetches();
      if (fetches) fetches[model.logits] = null;
      const [outputs, ms] = await timedRun(session, feeds, fetches);
      token = argmaxLast(outputs[model.logits]);
      outputs[model.logits].dispose();
      return { run: ms, memory: cache.commit(outputs, feed.length) };
    };
    return {
      alone: true,
      prefill: () => run(job.prompt_ids, 0),
      step: (position) => run([token], position),
      read: async () => [token],
      release() {},
    };
  });
}

export function notAToken(token, model, step, position) {
  if (token >= 0 && token < model.vocab_size) return;
  throw new Error(
    `model ${model.name} gave non-finite logits at step ${step} (position ${position}): NaN or Inf; its weights ` +
      'or its arithmetic (float16 overflow?) are broken, so no token can be chosen',
  );
}

// The generation loop of every path (the host's, the greedy graph's, captured.mjs's replay), reading up to perRead
// tokens together: makePath(perRead) makes the path's buffers (counted in the prefill) and returns {prefill(),
// step(position), read(k), release(), alone}: prefill and step run the prompt and one decode token, each returning
// {run (session.run's ms), memory (the cache's commit)}; read(k) reads the k tokens written since the last read;
// release() frees the path's buffers, once (also on error); alone: each token is read on its own (read_with 0).
export async function decodeWith(args, perRead, makePath) {
  const { job, counters, onStep, cancelled } = args;
  const { model, prompt_ids: promptIds, max_new_tokens: maxNewTokens } = job;
  const stop = new Set(job.stop_tokens);
  const steps = [];
  const tokens = [];
  // a burst's tokens read back (values, after the counters snapshot `read`): checked, the steps up to the first
  // stop token recorded (wall time shared out, run time the burst's mean, the read counted in the last step), the
  // rest undone
  const report = (burst, values, start, read, readWith) => {
    const k = burst.length;
    const readDelta = counters.delta(read, counters.snapshot());
    const last = burst[k - 1].gpu;
    for (const key of Object.keys(readDelta)) {
      last[key] = key.startsWith('live') ? readDelta[key] : last[key] + readDelta[key];
    }
    const wall = (performance.now() - start) / k;
    const run = burst.reduce((sum, s) => sum + s.run, 0) / k;
    values.forEach((t, i) => notAToken(t, model, steps.length + i, burst[i].position));
    const stopAt = values.findIndex((t) => stop.has(t));
    const kept = stopAt < 0 ? k : stopAt + 1; // the steps after a stop token: undone, never reported
    for (let i = 0; i < kept; i += 1) {
      const s = burst[i];
      const rec = record(steps.length, s.position, s.n, values[i], { wall, run }, s.memory, s.gpu, readWith);
      steps.push(rec);
      tokens.push(values[i]);
      if (onStep) onStep(rec);
    }
  };
  checkCancelled(cancelled);
  const t0 = performance.now();
  const first = counters.snapshot();
  const path = makePath(perRead);
  try {
    const ran = await path.prefill();
    const read = counters.snapshot();
    const prefill = { position: 0, n: promptIds.length, ...ran, gpu: counters.delta(first, read) };
    report([prefill], await path.read(1), t0, read, 0);
    let position = promptIds.length;
    while (tokens.length < maxNewTokens && !stop.has(tokens[tokens.length - 1])) {
      const k = Math.min(perRead, maxNewTokens - tokens.length);
      const start = performance.now();
      const burst = [];
      for (let i = 0; i < k; i += 1) {
        checkCancelled(cancelled);
        const before = counters.snapshot();
        const one = await path.step(position);
        burst.push({ position, n: 1, ...one, gpu: counters.delta(before, counters.snapshot()) });
        position += 1;
      }
      const burstRead = counters.snapshot();
      report(burst, await path.read(k), start, burstRead, path.alone ? 0 : k);
    }
  } finally {
    path.release();
  }
  return { tokens, steps };
}

// the greedy graph on args.session: step k of a burst reads its input ids from the ring tensor step k - 1 wrote
function decodeOnDevice(args) {
  const { ort, device, session, job, cache } = args;
  const { model } = job;
  const { greedy } = model;
  return decodeWith(args, job.tokens_per_read, (perRead) => {
    const ring = new TokenRing(ort, device, greedy.ids_dtype, perRead + 1);
    let ahead = 0; // steps run since the last read
    const run = async (idsTensor, position, n) => {
      const feeds = stepFeeds(ort, model, cache, idsTensor, position, n); // first: a static cache allocates here
      const fetches = cache.fetches() ?? {};
      for (const e of model.entries) if (!(e.present in fetches)) fetches[e.present] = null;
      fetches[greedy.next] = ring.tensor(ahead + 1);
      const [outputs, ms] = await timedRun(session, feeds, fetches);
      ahead += 1;
      return { run: ms, memory: cache.commit(outputs, n) };
    };
    return {
      prefill: () => run(ids(ort, greedy.ids_dtype, job.prompt_ids), 0, job.prompt_ids.length),
      step: (position) => run(ring.tensor(ahead), position, 1),
      read: (k) => {
        ahead = 0;
        return ring.read(k);
      },
      release: () => ring.release(),
    };
  });
}

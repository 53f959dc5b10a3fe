// A static cache whose decode steps replay a graph onnxruntime-web captured (its session option enableGraphCapture).
//
// Capture needs every input and output of a step to be the same GPU buffer, of the same shape, at every step: the
// KV buffers are the static cache's; FixedStep adds the rest, made once per generation: the input ids, the
// attention mask [1, max_cache_len] (ones, then zeros: job.py refuses a model that reads the mask's length), the
// greedy token, and a staging buffer for a burst's tokens. Between steps the host writes one mask element and the
// GPU copies the token into the ids buffer and the burst's slot: nothing is created per step.
//
// Contract: decodeCaptured(args) takes decode.mjs's arguments plus capture (the capturing session; the cache a
// StaticKV) and returns what decode returns: the prefill runs uncaptured on args.session; every decode step runs
// on capture (its first run records the graph, every later one replays it); tokens are read in bursts as
// decode.mjs's device path. Its buffers are destroyed exactly once, also on error.

import { READ_USAGE, TOKEN_USAGE, copyBuffers, decodeWith, halfToFloat, ids, mapRead, mapTokens, stepFeeds, timedRun } from './decode.mjs';
import { createBuffers } from './caches.mjs';

// onnxruntime-web registers a GPU buffer of the caller's with the wasm runtime for the length of one run and drops
// the registration after it, so the next run binds the same buffer under a new handle, which a captured graph
// (recorded with the old one) cannot replay. The runtime keeps its own output buffers registered for good, marked
// by a symbol-keyed record [handle, count] whose count is NaN. pinBuffers(own, buffers) finds that symbol on own
// (a buffer the runtime made) and gives each of buffers the same treatment: the record the runtime stores on it at
// its first registration gets the count NaN, so it keeps one handle for as long as the buffer lives.
export function pinBuffers(own, buffers) {
  const key = Object.getOwnPropertySymbols(own).find((s) => s.description === 'gpuBufferMetadata');
  if (!key) throw new Error('this onnxruntime-web keeps no registration record on its buffers: capture cannot pin');
  for (const b of buffers) {
    if (Object.getOwnPropertySymbols(b).includes(key)) continue;
    let record;
    Object.defineProperty(b, key, {
      configurable: true,
      get: () => record,
      set: (value) => {
        record = value;
        if (Array.isArray(record)) record[1] = NaN;
      },
    });
  }
}

// a buffer size: a multiple of 16 bytes, at least 16
const padded = (size) => Math.max(16, Math.ceil(size / 16) * 16);

export class FixedStep {
  constructor(ort, device, idsDtype, maxCacheLen, perRead, vocab, logitsType) {
    this.device = device;
    this.bytes = idsDtype === 'int32' ? 4 : 8;
    this.logitsType = logitsType;
    this.logitsBytes = padded(vocab * (logitsType === 'float16' ? 2 : 4));
    this.buffers = createBuffers(device, [
      [padded(this.bytes), TOKEN_USAGE],
      [padded(this.bytes), TOKEN_USAGE],
      [padded(8 * maxCacheLen), TOKEN_USAGE],
      [padded(this.bytes * perRead), READ_USAGE],
      [this.logitsBytes, TOKEN_USAGE],
      [2 * this.logitsBytes, READ_USAGE],
    ]);
    [this.idsBuffer, this.nextBuffer, this.maskBuffer, this.staging, this.logitsBuffer, this.check] = this.buffers;
    this.ids = ort.Tensor.fromGpuBuffer(this.idsBuffer, { dataType: idsDtype, dims: [1, 1] });
    this.next = ort.Tensor.fromGpuBuffer(this.nextBuffer, { dataType: idsDtype, dims: [1, 1] });
    this.logits = ort.Tensor.fromGpuBuffer(this.logitsBuffer, { dataType: logitsType, dims: [1, 1, vocab] });
    this.mask = ort.Tensor.fromGpuBuffer(this.maskBuffer, { dataType: 'int64', dims: [1, maxCacheLen] });
  }

  // the mask's positions [from, to) set to one
  ones(from, to) {
    this.device.queue.writeBuffer(this.maskBuffer, from * 8, new BigInt64Array(to - from).fill(1n));
  }

  // the buffers a step binds (the staging buffer is only copied into)
  bound() {
    return this.buffers.filter((b) => b !== this.staging && b !== this.check);
  }

  // after a step: its token (in next, the token buffer by default) becomes the next step's ids and the burst's
  // slot-th token
  keep(slot, next = this.nextBuffer) {
    copyBuffers(this.device, [
      [next, this.idsBuffer, 0, this.bytes],
      [next, this.staging, slot * this.bytes, this.bytes],
    ]);
  }

  // the logits copied into half `half` of the check buffer (0: the uncaptured step's, 1: the replay's)
  keepCheck(half) {
    copyBuffers(this.device, [[this.logitsBuffer, this.check, half * this.logitsBytes, this.logitsBytes]]);
  }

  // both halves of the check buffer, as numbers
  async readCheck() {
    const range = await mapRead(this.check, 2 * this.logitsBytes);
    const values = this.logitsType === 'float16' ? Array.from(new Uint16Array(range), halfToFloat) : new Float32Array(range);
    const n = values.length / 2;
    return [values.slice(0, n), values.slice(n)];
  }

  release() {
    if (!this.buffers) return;
    for (const b of this.buffers) b.destroy();
    this.buffers = null;
  }
}

// The first replayed step (the second decode step: the first one captured) runs uncaptured first, on the plain
// session with the same buffers (it writes the same KV position), and its logits are kept; compareReplay then
// throws an Error named 'CaptureRefused' when the replay's logits differ from them by more than REPLAY_TOLERANCE
// of their largest magnitude: the replay did not reproduce the step (what changes between steps is the mask's
// count of ones, the step's length: where the model reads it, the job says in step_length_inputs). The session
// must be opened with the WebGPU EP as an options object (runner.mjs webgpuEp): onnxruntime-web hands the
// session's enableGraphCapture to the EP only then, and a session that binds its inputs once but never captures
// is what this check refuses.
const REPLAY_TOLERANCE = 1e-3;

async function compareReplay(args, fixed, position) {
  fixed.keepCheck(1);
  const [uncaptured, replayed] = await fixed.readCheck();
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < uncaptured.length; i += 1) {
    diff = Math.max(diff, Math.abs(uncaptured[i] - replayed[i]));
    scale = Math.max(scale, Math.abs(uncaptured[i]));
  }
  if (diff <= REPLAY_TOLERANCE * Math.max(scale, 1)) return;
  const { model } = args.job;
  const where = model.step_length_inputs ? ` (${model.step_length_inputs})` : '';
  const err = new Error(
    `graph capture refused for model ${model.name}: onnxruntime-web's replay of the captured decode step at ` +
      `position ${position} gave logits up to ${diff.toPrecision(3)} away from the same step run uncaptured: the ` +
      `replay does not reproduce the step (the step's length reaches the model through the mask${where}). Run it ` +
      `with a plain static cache`,
  );
  err.name = 'CaptureRefused';
  throw err;
}

export function decodeCaptured(args) {
  const { ort, device, session, capture, job, cache } = args;
  const { model } = job;
  const { greedy } = model;
  return decodeWith(args, job.tokens_per_read, (perRead) => {
    const fixed = new FixedStep(ort, device, greedy.ids_dtype, cache.maxCacheLen, perRead, model.vocab_size, model.logits_dtype);
    let slot = 0; // steps run since the last read: the staging slot of the next token
    let decoded = 0;
    return {
      async prefill() {
        const n = job.prompt_ids.length;
        const feeds = stepFeeds(ort, model, cache, ids(ort, greedy.ids_dtype, job.prompt_ids), 0, n);
        const fetches = { ...cache.fetches(), [greedy.next]: null }; // the runtime's own token tensor: see pinBuffers
        const [out, run] = await timedRun(session, feeds, fetches);
        const memory = cache.commit(out, n);
        pinBuffers(out[greedy.next].gpuBuffer, [...fixed.bound(), ...cache.buffers]);
        fixed.ones(0, n);
        fixed.keep(0, out[greedy.next].gpuBuffer);
        out[greedy.next].dispose();
        slot = 1;
        return { run, memory };
      },
      async step(position) {
        decoded += 1;
        fixed.ones(position, position + 1);
        const feeds = { [model.input_ids]: fixed.ids, [model.attention_mask]: fixed.mask, ...cache.feeds(position, 1) };
        const fetches = { ...cache.fetches(), [greedy.next]: fixed.next, [model.logits]: fixed.logits };
        if (decoded === 2) {
          await session.run(feeds, fetches);
          fixed.keepCheck(0);
        }
        const [outputs, run] = await timedRun(capture, feeds, fetches);
        if (decoded === 2) await compareReplay(args, fixed, position);
        const memory = cache.commit(outputs, 1);
        fixed.keep(slot);
        slot += 1;
        return { run, memory };
      },
      read(k) {
        slot = 0;
        return mapTokens(fixed.staging, k, greedy.ids_dtype);
      },
      release: () => fixed.release(),
    };
  });
}

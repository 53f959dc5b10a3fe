// The two KV caches of kvlab's browser runner, on onnxruntime-web's WebGPU EP.
//
// Contract shared by both: feeds(position) gives the past inputs of the next run, fetches() the preallocated
// outputs (or undefined), commit(outputs) takes what the run returned and says what the step did to the cache's
// memory ({tensors, bytes, new_buffers, live_bytes}), release() frees every GPU resource the cache holds, exactly
// once (a second call does nothing). A cache serves one generation; make a new one for the next.
//
// StaticKV: every KV buffer created once, at max_cache_len, with device.createBuffer, wrapped with
// ort.Tensor.fromGpuBuffer and bound both as the past input and as the preallocated present output of every run
// (GroupQueryAttention sees the same buffer and writes only the new positions). Allocation is all-or-nothing.
// DynamicKV: what transformers.js does by default: the runtime returns fresh present tensors every step (one
// token longer), they become the next pasts, and the previous ones are disposed after the run.

const ELEMENT_BYTES = { float32: 4, float16: 2 };
const KV_USAGE = 0x80 | 0x4 | 0x8; // GPUBufferUsage STORAGE | COPY_SRC | COPY_DST

function entryBytes(model, entry, length) {
  return entry.kv_heads * length * entry.head_dim * ELEMENT_BYTES[model.dtype];
}

export function cacheBytes(model, length) {
  return model.entries.reduce((sum, e) => sum + entryBytes(model, e, length), 0);
}

function emptyPast(ort, model, entry) {
  const data = model.dtype === 'float16' ? new Uint16Array(0) : new Float32Array(0);
  return new ort.Tensor(model.dtype, data, [1, entry.kv_heads, 0, entry.head_dim]);
}

// GPU buffers of the given [size, usage] pairs made on device, all or none: when one fails, those made are
// destroyed and the error thrown
export function createBuffers(device, specs) {
  const made = [];
  try {
    for (const [size, usage] of specs) made.push(device.createBuffer({ size, usage }));
  } catch (err) {
    for (const b of made) b.destroy();
    throw err;
  }
  return made;
}

// how many of the tensors' GPU buffers are not in seen (a WeakSet); adds them to it
export function countFresh(tensors, seen) {
  let fresh = 0;
  for (const t of tensors) {
    const buffer = t.location === 'gpu-buffer' ? t.gpuBuffer : null;
    if (buffer && !seen.has(buffer)) {
      seen.add(buffer);
      fresh += 1;
    }
  }
  return fresh;
}

export class StaticKV {
  constructor(ort, device, model, maxCacheLen) {
    this.ort = ort;
    this.device = device;
    this.model = model;
    this.maxCacheLen = maxCacheLen;
    this.buffers = null; // the KV buffers, made at the first feeds()
    this.tensors = null;
    this.released = false;
    this.madeThisStep = 0;
  }

  allocate() {
    if (this.released) throw new Error('this static cache was released; make a new one');
    if (this.buffers) return;
    const sizes = this.model.entries.map((e) => [entryBytes(this.model, e, this.maxCacheLen), KV_USAGE]);
    this.buffers = createBuffers(this.device, sizes);
    this.tensors = this.model.entries.map((e, i) => {
      const dims = [1, e.kv_heads, this.maxCacheLen, e.head_dim];
      return this.ort.Tensor.fromGpuBuffer(this.buffers[i], { dataType: this.model.dtype, dims });
    });
    this.madeThisStep = this.buffers.length;
  }

  feeds(position, n) {
    if (position + n > this.maxCacheLen) {
      throw new Error(`${position + n} positions are needed but max_cache_len is ${this.maxCacheLen}`);
    }
    this.allocate();
    return Object.fromEntries(this.model.entries.map((e, i) => [e.past, this.tensors[i]]));
  }

  fetches() {
    return Object.fromEntries(this.model.entries.map((e, i) => [e.present, this.tensors[i]]));
  }

  commit(outputs) {
    this.model.entries.forEach((e, i) => {
      const out = outputs[e.present];
      if (out !== this.tensors[i] && out?.gpuBuffer !== this.buffers[i]) {
        throw new Error(`present ${e.present} was not written into the buffer bound for it (in-place check)`);
      }
    });
    const made = this.madeThisStep;
    this.madeThisStep = 0;
    const size = cacheBytes(this.model, this.maxCacheLen);
    return { tensors: made, bytes: made ? size : 0, new_buffers: made, live_bytes: size };
  }

  release() {
    if (this.released) return;
    this.released = true;
    for (const b of this.buffers ?? []) b.destroy();
    this.buffers = null;
    this.tensors = null;
  }
}

export class DynamicKV {
  constructor(ort, model) {
    this.ort = ort;
    this.model = model;
    this.presents = null;
    this.seen = new WeakSet();
    this.released = false;
    this.length = 0;
  }

  feeds() {
    if (this.released) throw new Error('this dynamic cache was released; make a new one');
    return Object.fromEntries(
      this.model.entries.map((e, i) => [e.past, this.presents ? this.presents[i] : emptyPast(this.ort, this.model, e)]),
    );
  }

  fetches() {
    return undefined;
  }

  commit(outputs, n) {
    const fresh = this.model.entries.map((e) => outputs[e.present]);
    const previous = this.presents;
    this.presents = fresh;
    this.length += n;
    for (const t of previous ?? []) t.dispose();
    const bytes = cacheBytes(this.model, this.length);
    return { tensors: fresh.length, bytes, new_buffers: countFresh(fresh, this.seen), live_bytes: bytes };
  }

  release() {
    if (this.released) return;
    this.released = true;
    for (const t of this.presents ?? []) t.dispose();
    this.presents = null;
  }
}

// where the session leaves each output: the KV presents and the greedy graph's token on the GPU, the logits (read
// by the host path only) on the CPU
export function outputLocations(model) {
  const where = { [model.logits]: 'cpu' };
  for (const e of model.entries) where[e.present] = 'gpu-buffer';
  if (model.greedy) where[model.greedy.next] = 'gpu-buffer';
  return where;
}

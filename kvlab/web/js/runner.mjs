// Runs one job (kvlab/web/job.py's JSON) on onnxruntime-web's WebGPU EP, in whatever host gives it a
// navigator.gpu: a browser page, the notebook widget, or Node with Dawn's bindings.
//
// Contract: runJob({ort, gpu, job, bytes, host, transformers, onStep, cancelled}) opens one session from bytes
// ({file name: Uint8Array}) on gpu's high-performance adapter, the WebGPU EP in the job's modes (webgpuEp): the
// greedy graph where the job sends one, else the decoder; counts the EP's GPUDevice's buffers from then on
// (counters.mjs), then runs every cache of the job for job.reps rounds (after one warm-up round when job.warmup),
// interleaved. The dynamic cache runs through transformers.js when transformers (a loader: () => module) is given
// and the job allows it; where transformers.js cannot run the model and the job says "auto", its error is kept in
// the result and the dynamic cache runs on onnxruntime-web directly. A captured cache (variant 'graph') replays
// its decode steps on a second, capturing session per generation (openCapture; captured.mjs); where
// onnxruntime-web cannot capture the model the result's refused[cache name] says why and the other caches go on.
// cancelled (() => bool) is asked before every step: the job stops there and the result says {cancelled: true}.
// Every cache and the session are released exactly once, also on error; the result says what each release
// destroyed. Returns the result kvlab/web/results.py reads; throws on an error that leaves nothing to report.

import { countBuffers } from './counters.mjs';
import { DynamicKV, StaticKV, outputLocations } from './caches.mjs';
import { decode } from './decode.mjs';
import { decodeCaptured } from './captured.mjs';
import { generateWithTransformers } from './tjs.mjs';
import { openAdapter } from './host.mjs';

// every model file a job names: the decoder, its external data, the greedy graph and the graph for transformers.js
// when the job has them
export function jobFiles(job) {
  const extra = [job.model.greedy, job.model.transformers_graph].filter(Boolean);
  return [...job.model.files, ...extra];
}

// what a host reports when the job failed before it had a result
export function errorResult(err) {
  return { error: `${err?.message ?? err}`, stack: `${err?.stack ?? ''}` };
}

// the WebGPU EP's options: the job's validation mode (onnxruntime-web's own default, "basic", where a job has
// none) and storage buffer cache mode (onnxruntime-web's default where the job names none)
export function webgpuEp(job) {
  const ep = { name: 'webgpu' };
  if (job.validation_mode) ep.validationMode = job.validation_mode;
  if (job.buffer_cache_mode) ep.storageBufferCacheMode = job.buffer_cache_mode;
  return ep;
}

// whether Dawn validates the device's calls (false where its host made it with skip_validation): one buffer of a
// usage WebGPU forbids (MAP_READ with STORAGE), made inside an error scope and destroyed
export async function dawnValidates(device) {
  device.pushErrorScope('validation');
  const probe = device.createBuffer({ size: 16, usage: 0x1 | 0x80 }); // GPUBufferUsage MAP_READ | STORAGE
  const error = await device.popErrorScope();
  probe.destroy();
  return error !== null;
}

// the session a captured cache replays its decode steps on: the same graph, opened with enableGraphCapture, every
// output on the GPU; onnxruntime-web's refusal (a node it cannot capture, an input it cannot keep fixed) is named
export async function openCapture(ort, bytes, job, ep, externalData) {
  const where = { ...outputLocations(job.model), [job.model.logits]: 'gpu-buffer' };
  try {
    return await ort.InferenceSession.create(bytes[job.model.greedy.name], {
      executionProviders: [ep],
      externalData,
      enableGraphCapture: true,
      preferredOutputLocation: where,
    });
  } catch (err) {
    const refused = new Error(
      `graph capture refused by onnxruntime-web ${ort.env.versions.web} for model ${job.model.name}: ` +
        `${err?.message ?? err}`,
    );
    refused.name = 'CaptureRefused';
    throw refused;
  }
}

async function runOwn({ ort, device, session, job, spec, counters, onStep, cancelled, openCaptured }) {
  const cache =
    spec.kind === 'static' ? new StaticKV(ort, device, job.model, spec.max_cache_len) : new DynamicKV(ort, job.model);
  const captured = spec.variant === 'graph';
  let result;
  let before;
  let capture = null;
  try {
    // a captured graph replays the very buffers it recorded: one capturing session per generation, released with it
    if (captured) capture = await openCaptured();
    const args = { ort, device, session, capture, job, cache, counters, onStep, cancelled };
    result = await (captured ? decodeCaptured : decode)(args);
  } finally {
    before = counters.snapshot();
    cache.release();
    if (capture) await capture.release();
  }
  const released = counters.delta(before, counters.snapshot());
  return { ...result, release: { buffers_destroyed: released.destroyed, bytes_destroyed: released.bytes_destroyed } };
}

export async function runJob({ ort, gpu, job, bytes, host, transformers, onStep, cancelled }) {
  const { adapter, adapterInfo } = await openAdapter(gpu);
  if (job.model.dtype === 'float16' && !adapterInfo.features.includes('shader-f16')) {
    throw new Error(
      `model ${job.model.name} keeps a float16 KV cache, but this adapter (${adapterInfo.vendor} ` +
        `${adapterInfo.architecture}) has no shader-f16; run a float32 build`,
    );
  }
  ort.env.wasm.numThreads = 1;
  ort.env.webgpu.adapter = adapter; // the EP makes its device on this adapter (it ignores a device set here)
  const out = { version: 1, host, adapter: adapterInfo, ort_version: ort.env.versions.web, transformers: null, runs: [] };
  const decoder = (job.model.greedy ?? job.model.files[0]).name; // kvlab's own runs: the greedy graph, when sent
  const externalData = job.model.files.slice(1).map((f) => ({ path: f.name, data: bytes[f.name] }));
  const t0 = performance.now();
  const ep = webgpuEp(job);
  out.validation_mode = ep.validationMode ?? 'basic';
  const session = await ort.InferenceSession.create(bytes[decoder], {
    executionProviders: [ep],
    externalData,
    preferredOutputLocation: outputLocations(job.model),
  });
  out.session_ms = performance.now() - t0;
  // the EP's own device, wrapped before any run: every buffer a step creates or destroys is counted
  const device = await ort.env.webgpu.device;
  out.dawn_validates = await dawnValidates(device); // before counting: the probe is not the run's
  const counters = countBuffers(device);
  out.device_features = [...device.features].sort();
  let tjs = null;
  out.refused = {}; // cache name -> why it could not run (a captured cache onnxruntime-web cannot capture)
  const openCaptured = () => openCapture(ort, bytes, job, ep, externalData);
  const wantTjs = job.dynamic_impl !== 'onnxruntime-web' && job.caches.some((c) => c.kind === 'dynamic');
  try {
    if (wantTjs && transformers) {
      try {
        tjs = await transformers();
        out.transformers = { version: tjs.env?.version ?? '', error: null };
      } catch (err) {
        out.transformers = { version: '', error: `loading transformers.js failed: ${err?.message ?? err}` };
      }
    } else if (wantTjs) {
      out.transformers = { version: '', error: `transformers.js needs a browser; this host is ${host.kind}` };
    }
    if (job.dynamic_impl === 'transformers.js' && !tjs) throw new Error(out.transformers.error);
    const rounds = Array.from({ length: job.reps }, (_, rep) => ({ rep, warmup: false }));
    if (job.warmup) rounds.unshift({ rep: -1, warmup: true });
    for (const round of rounds) {
      for (const spec of job.caches) {
        const base = { cache: spec.name, kind: spec.kind, max_cache_len: spec.max_cache_len, ...round };
        if (spec.kind === 'dynamic' && tjs) {
          try {
            const r = await generateWithTransformers({ tjs, job, bytes, counters, ep, cancelled });
            out.runs.push({ ...base, impl: 'transformers.js', tokens: r.tokens, steps: r.steps, release: null });
            for (const s of r.steps) onStep?.(s);
            continue;
          } catch (err) {
            if (err?.name === 'Cancelled') throw err;
            out.transformers.error = `transformers.js could not run model ${job.model.name}: ${err?.message ?? err}`;
            tjs = null;
            if (job.dynamic_impl === 'transformers.js') throw new Error(out.transformers.error);
          }
        }
        if (spec.name in out.refused) continue;
        try {
          const r = await runOwn({ ort, device, session, job, spec, counters, onStep, cancelled, openCaptured });
          out.runs.push({ ...base, impl: 'onnxruntime-web', ...r });
        } catch (err) {
          if (err?.name !== 'CaptureRefused') throw err;
          out.refused[spec.name] = err.message; // the other caches go on
        }
      }
    }
  } catch (err) {
    if (err?.name !== 'Cancelled') throw err;
    out.cancelled = true; // the runs before it are kept; the cache it stopped was released by runOwn
  } finally {
    await session.release();
    out.counters = counters.snapshot();
  }
  return out;
}

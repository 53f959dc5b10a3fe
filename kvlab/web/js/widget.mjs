// The notebook widget's front end (anywidget): the runner in the attendee's own browser, fed over the Jupyter
// comm channel, so it works wherever the notebook does (a laptop, Binder, JupyterHub): no side server, no CDN.
//
// Contract (messages; kvlab/web/widget.py is the other side):
//   front end -> kernel  {type: 'start', have: [blob names it already holds], browser: describeBrowser()}  on Run
//   kernel -> front end  {type: 'blob', name, index, count} + one binary buffer  (npm assets, model files: chunks)
//   kernel -> front end  {type: 'job', job, assets: {ort, 'ort-wasm', transformers}}  the job; its files were sent as blobs
//   kernel -> front end  {type: 'recorded'}  nothing runs here (no WebGPU adapter): the kernel shows the recording
//   front end -> kernel  {type: 'step', step} per finished step, then {type: 'result', result}; a cancelled run's
//                        result is {cancelled: true, counters} (every cache and the session released first)
// While a job runs the widget shows steps done of the job's total, the elapsed time and an estimate of the time
// left (from the steps after the first, which compiles the shaders), and a Cancel button; when it ends, the steps
// done and the time they took.
// On render the widget also reports this browser and its WebGPU adapter in the synced trait `browser`.
// Assets stay in this page (globalThis) for every later widget; onnxruntime-web is imported once per page.

import { browserHost, describeBrowser, reportBrowser } from './host.mjs';
import { errorResult, jobFiles, runJob } from './runner.mjs';
import { loadTransformers } from './tjs.mjs';

const pageState = (globalThis.__kvlabWeb ??= { blobs: new Map(), ort: null, ortUrl: null });

// a blob's chunk kept; once every chunk came, the blob's bytes (a new message of a finished name starts it over)
function receiveBlob(msg, buffers) {
  let parts = pageState.blobs.get(msg.name);
  if (!parts || parts.bytes || parts.chunks.length !== msg.count) {
    parts = { chunks: new Array(msg.count), bytes: null };
    pageState.blobs.set(msg.name, parts);
  }
  const view = buffers[0];
  parts.chunks[msg.index] = new Uint8Array(view.buffer, view.byteOffset, view.byteLength).slice();
  if (parts.chunks.filter(Boolean).length === msg.count) {
    parts.bytes = new Uint8Array(parts.chunks.reduce((n, c) => n + c.byteLength, 0));
    let offset = 0;
    for (const c of parts.chunks) {
      parts.bytes.set(c, offset);
      offset += c.byteLength;
    }
    parts.chunks = [];
  }
}

function blob(name) {
  const bytes = pageState.blobs.get(name)?.bytes;
  if (!bytes) throw new Error(`the kernel did not send ${name}`);
  return bytes;
}

async function loadOrt(assets) {
  if (!pageState.ort) {
    const text = new TextDecoder().decode(blob(assets.ort));
    pageState.ortUrl = URL.createObjectURL(new Blob([text], { type: 'text/javascript' }));
    pageState.ort = await import(pageState.ortUrl);
    const wasm = blob(assets['ort-wasm']);
    pageState.ort.env.wasm.wasmBinary = wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength);
    pageState.ort.env.wasm.wasmPaths = { wasm: URL.createObjectURL(new Blob([wasm], { type: 'application/wasm' })) };
  }
  return pageState.ort;
}

// how many steps a job runs: every cache, every round (the warm-up too), max_new_tokens each (fewer on a stop token)
function totalSteps(job) {
  return job.caches.length * (job.reps + (job.warmup ? 1 : 0)) * job.max_new_tokens;
}

function seconds(ms) {
  return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
}

// "step 12 / 64 · 8.1 s elapsed · about 20 s left"
function progressText(done, total, elapsedMs, firstStepMs) {
  let left = 'estimate after the first steps (the first compiles the shaders)';
  if (done >= 2 && firstStepMs !== null) {
    const rate = (elapsedMs - firstStepMs) / (done - 1);
    left = `about ${seconds(rate * Math.max(0, total - done))} left`;
  }
  return `step ${done} / ${total} · ${seconds(elapsedMs)} elapsed · ${left}`;
}

async function runHere(model, msg, onStep, cancelled) {
  const { job, assets } = msg;
  const ort = await loadOrt(assets);
  const bytes = {};
  for (const f of jobFiles(job)) bytes[f.name] = blob(`model:${job.model.name}:${f.name}`);
  const transformers = assets.transformers
    ? async () => loadTransformers(pageState.ortUrl, new TextDecoder().decode(blob(assets.transformers)))
    : null;
  return runJob({ ort, gpu: navigator.gpu, job, bytes, host: await browserHost(), transformers, onStep, cancelled });
}

function render({ model, el }) {
  el.classList.add('kvlab-browser-lab');
  const make = (tag, name, text = '') => {
    const e = document.createElement(tag);
    e.className = name;
    e.textContent = text;
    return e;
  };
  const button = make('button', 'kvlab-browser-run', "Run it on this browser's GPU");
  const cancel = make('button', 'kvlab-browser-cancel', 'Cancel');
  cancel.style.display = 'none';
  const [adapter, plan, progress, status] = ['adapter', 'plan', 'progress', 'status'].map((n) =>
    make('div', `kvlab-browser-${n}`),
  );
  const summary = make('pre', 'kvlab-browser-summary');
  el.append(adapter, button, cancel, plan, progress, status, summary);

  const show = () => {
    status.textContent = model.get('status');
    summary.textContent = model.get('summary');
    plan.textContent = model.get('plan');
    const b = model.get('browser');
    const a = b?.adapter;
    adapter.textContent = a
      ? `this browser: ${b.name}; WebGPU adapter: ${[a.vendor, a.architecture].filter(Boolean).join(' ') || a.description}${a.is_fallback ? ' (software)' : ''}`
      : b?.name
        ? `this browser: ${b.name}; ${b.webgpu ? b.error ?? 'WebGPU adapter: ...' : 'no WebGPU (navigator.gpu is missing)'}`
        : '';
    button.disabled = model.get('running');
  };
  for (const trait of ['status', 'summary', 'plan', 'browser', 'running']) model.on(`change:${trait}`, show);
  show();

  reportBrowser(model);

  let mine = false; // only the view whose button was pressed runs the job (a widget may be shown twice)
  let run = null; // the running job's progress: {total, done, start, firstStep, cancel, timer}
  const tick = () => {
    if (!run) return;
    const text = progressText(run.done, run.total, performance.now() - run.start, run.firstStep);
    progress.textContent = run.cancel ? `${text} · cancelling after this step` : text;
  };
  const finish = (result) => {
    clearInterval(run.timer);
    progress.textContent = `${run.done} steps in ${seconds(performance.now() - run.start)}`;
    run = null;
    cancel.style.display = 'none';
    model.send({ type: 'result', result });
  };
  const onMessage = (msg, buffers) => {
    if (msg.type === 'blob') receiveBlob(msg, buffers);
    if (msg.type === 'recorded') mine = false;
    if (msg.type === 'job' && mine) {
      mine = false;
      run = { total: totalSteps(msg.job), done: 0, start: performance.now(), firstStep: null, cancel: false };
      run.timer = setInterval(tick, 500);
      cancel.disabled = false;
      cancel.style.display = '';
      tick();
      const current = run;
      const onStep = (step) => {
        current.done += 1;
        if (current.firstStep === null) current.firstStep = performance.now() - current.start;
        tick();
        model.send({ type: 'step', step });
      };
      runHere(model, msg, onStep, () => current.cancel).then(finish, (err) => finish(errorResult(err)));
    }
  };
  model.on('msg:custom', onMessage);
  cancel.addEventListener('click', () => {
    if (run) run.cancel = true;
    cancel.disabled = true;
    tick();
  });
  button.addEventListener('click', async () => {
    mine = true;
    progress.textContent = '';
    const have = [...pageState.blobs.entries()].filter(([, b]) => b.bytes).map(([name]) => name);
    const browser = model.get('browser')?.name ? model.get('browser') : await describeBrowser();
    model.send({ type: 'start', have, browser });
  });
  return () => {
    model.off('msg:custom', onMessage);
    if (run) clearInterval(run.timer); // the run itself goes on and reports to the kernel
  };
}

export default { render };

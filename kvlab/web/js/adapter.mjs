// The adapter widget's front end (anywidget; kvlab/web/adapter.py is the other side): asks the browser showing
// the notebook for its WebGPU adapter and hands the answer to the kernel.
//
// Contract: on render, when the synced trait `browser` is still empty, it is set once to the browser's answer
// (host.mjs's reportBrowser: its name, whether it has navigator.gpu, its adapter's info or why there is none)
// and saved, so the kernel holds it. The table drawn is the kernel's trait `table` ([label, kernel, browser]
// triples under `header`), redrawn whenever the kernel changes it: all wording is the kernel's.

import { reportBrowser } from './host.mjs';

function render({ model, el }) {
  el.classList.add('kvlab-adapters');
  const table = document.createElement('table');
  el.append(table);
  const cell = (tag, text) => {
    const c = document.createElement(tag);
    c.textContent = text;
    return c;
  };
  const show = () => {
    table.replaceChildren();
    const head = document.createElement('tr');
    for (const h of model.get('header')) head.append(cell('th', h));
    table.append(head);
    for (const row of model.get('table')) {
      const tr = document.createElement('tr');
      tr.append(cell('th', row[0]), ...row.slice(1).map((v) => cell('td', v)));
      table.append(tr);
    }
  };
  model.on('change:table', show);
  show();
  reportBrowser(model);
  return () => model.off('change:table', show);
}

export default { render };

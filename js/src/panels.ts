/**
 * Step panels without a kernel behind them.
 *
 * The step panel (`%step panel`) is an ipywidgets widget: it lives as long as
 * the kernel that drew it. After a kernel restart its buttons can no longer
 * work, and after a page reload with no kernel JupyterLab shows "Error
 * displaying widget: model not found" in its place. In both cases this module
 * hides the dead widget and shows instead one line saying why, and the run's
 * steps as the store holds them now (the cell marks' data, so it is current).
 * At a restart the output also forgets the widget's model id, so a notebook
 * saved after it reopens with no such error (a notebook saved while its kernel
 * lived and reopened without it still has the id: the widget manager says so
 * in the console before this module replaces the panel).
 * A panel saved as text only (the widget was not saved with the notebook)
 * is an old snapshot: it is replaced the same way.
 * A panel shown again (`%step panel`) in the new kernel is live and left alone.
 *
 * A panel output is recognised by its plain-text form, which starts with
 * "nbdurable run '<run id>'" (StepPanel.text() in nbdurable/ipython/panel.py).
 */

import type { CodeCell, Cell } from '@jupyterlab/cells';

import { IStepRow, IStepsReply, describe } from './model';

const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';
const DEAD_CLASS = 'nbd-panel-ended';
const SNAPSHOT_CLASS = 'nbd-snapshot';
/** The first words of StepPanel.text(): the run id comes as a Python repr. */
const PANEL_TEXT = /^nbdurable run ['"]/;
const REOPENED = 'The notebook was reopened';

export class PanelKeeper {
  /**
   * The kernel restarted: every panel drawn so far is dead.
   *
   * Each one's output forgets its widget model (``model_id`` made empty, as
   * ipywidgets leaves a closed view): saved so, the notebook reopens with the
   * snapshot and without the widget manager's "model not found" error, in the
   * page or its console. Whether the notebook has unsaved changes is left as
   * it was: nothing the user wrote changed.
   */
  kernelRestarted(cells: readonly Cell[], notebook?: { dirty: boolean }): void {
    const dirty = notebook?.dirty;
    for (const { modelId, outputs, index } of panelOutputs(cells)) {
      if (modelId === null) {
        continue;
      }
      this._dead.set(modelId, 'The kernel restarted');
      const json = outputs.get(index).toJSON() as any;
      const data = { ...json.data, [WIDGET_MIME]: { ...json.data[WIDGET_MIME], model_id: '' } };
      outputs.set(index, { ...json, data });
      this._ended.add(outputs.get(index));
    }
    if (notebook && dirty !== undefined) {
      notebook.dirty = dirty;
    }
  }

  /** Replace dead panels by a snapshot of ``reply`` (null: not fetched yet). */
  draw(cells: readonly Cell[], reply: IStepsReply | null): void {
    for (const { node, modelId, outputs, index } of panelOutputs(cells)) {
      let why = this._ended.has(outputs.get(index))
        ? 'The kernel restarted'
        : modelId === null
          ? REOPENED
          : this._dead.get(modelId);
      // A widget the page could not restore shows an error, or its saved text.
      if (why === undefined && /^\s*nbdurable run ['"]|Error displaying widget/.test(shown(node))) {
        why = REOPENED;
      }
      if (why === undefined) {
        node.classList.remove(DEAD_CLASS);
        node.querySelector(`:scope > .${SNAPSHOT_CLASS}`)?.remove();
        continue;
      }
      node.classList.add(DEAD_CLASS);
      let snap = node.querySelector(`:scope > .${SNAPSHOT_CLASS}`) as HTMLElement | null;
      if (snap === null) {
        snap = document.createElement('div');
        snap.className = SNAPSHOT_CLASS;
        node.appendChild(snap);
      }
      renderSnapshot(snap, why, reply);
    }
  }

  private _dead = new Map<string, string>();
  /** The outputs kernelRestarted() rewrote (new models: a reopened page has none). */
  private _ended = new WeakSet<object>();
}

interface IPanelOutput {
  node: HTMLElement;
  /** The widget model's id; null when saved as text only, or its model was forgotten. */
  modelId: string | null;
  outputs: CodeCell['model']['outputs'];
  index: number;
}

/** The output nodes of step panels, with their widget model ids. */
function panelOutputs(cells: readonly Cell[]): IPanelOutput[] {
  const out: IPanelOutput[] = [];
  for (const cell of cells) {
    if (cell.model.type !== 'code') {
      continue;
    }
    const outputs = (cell as CodeCell).model.outputs;
    const area = (cell as CodeCell).outputArea;
    for (let i = 0; i < outputs.length; i++) {
      const data = outputs.get(i).data;
      const view = data[WIDGET_MIME] as { model_id?: string } | undefined;
      const text = data['text/plain'];
      const plain = Array.isArray(text) ? text.join('') : String(text ?? '');
      if (PANEL_TEXT.test(plain) && area?.widgets[i]) {
        out.push({ node: area.widgets[i].node, modelId: view?.model_id || null, outputs, index: i });
      }
    }
  }
  return out;
}

function shown(node: HTMLElement): string {
  const rendered = node.querySelector('.jp-OutputArea-output');
  return rendered ? rendered.textContent ?? '' : '';
}

function el(tag: string, className: string, text = ''): HTMLElement {
  const e = document.createElement(tag);
  e.className = className;
  e.textContent = text;
  return e;
}

function renderSnapshot(snap: HTMLElement, why: string, reply: IStepsReply | null): void {
  const rows: IStepRow[] = [];
  const seen = new Set<string>();
  for (const row of reply ? [...reply.cells, ...reply.others] : []) {
    if (!seen.has(row.key)) {
      seen.add(row.key);
      rows.push(row);
    }
  }
  const key = JSON.stringify([why, rows]);
  if (snap.dataset.nbdDrawn === key) {
    return;
  }
  snap.dataset.nbdDrawn = key;
  const note = el(
    'div',
    'nbd-snapshot-note',
    `${why}: this panel is not live. Steps as stored now; run %load_ext nbdurable, then ` +
      '%step panel, for a live one.'
  );
  const list = el('div', 'nbd-snapshot-rows');
  for (const row of rows) {
    const m = describe(row.state, row);
    const line = el('div', 'nbd-mark nbd-snapshot-row');
    line.dataset.nbdState = m.state;
    line.dataset.nbdKey = row.key;
    line.title = m.title;
    line.append(
      el('span', 'nbd-snapshot-label', row.label),
      el('span', 'nbd-mark-badge', m.badge),
      ...m.facts.map(f => el('span', 'nbd-mark-fact', f)),
      ...(m.detail ? [el('span', 'nbd-mark-detail', m.detail)] : [])
    );
    list.appendChild(line);
  }
  if (reply === null) {
    list.appendChild(el('div', 'nbd-snapshot-row', 'reading the store…'));
  }
  snap.replaceChildren(note, list);
}

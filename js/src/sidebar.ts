/**
 * The step panel as a side panel of JupyterLab and Notebook 7.
 *
 * It follows the active notebook and shows the rows its cell marks show (the
 * same reply of GET /nbdurable/api/steps, the same `markFor` for each cell,
 * so the sidebar and the marks never disagree), in notebook order, then the
 * steps no longer in the notebook. Each row: the state, the step's name and
 * cell, what its record holds (when, how long, calls, tokens), the reason it
 * will run, and Pin / Unpin and Clear; the header: the run, the counts, and
 * Clear all. The buttons POST to the same endpoint, which runs the CLI's own
 * commands on the store (nbdurable.server.marks.act); Clear of a step with
 * sub-steps and Clear all ask first, since those calls would be made again.
 * What a button did is said under the header until the next one.
 *
 * **Waiting for a decision** lists the run's pending approvals (the reply's
 * `approvals`): each one's summary, details and step, with Approve, and Reject
 * with a reason. They POST `approve` / `reject`, which decide through the one
 * function `nbdurable approve` uses; the waiting kernel sees the decision
 * within a second and goes on (headless, the next run does).
 *
 * **Runs…** lists the store's runs (GET ...?runs=1, asked only when opened:
 * listing reads every run), each fork with the run it was forked from, and
 * **Compare** beside another run shows this notebook's run beside it, step by
 * step, as `nbdurable diff` says it (GET ...?compare=RUN).
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import type { CellMarks, IMarksDrawn } from './marks';
import { IApproval, IMark, IStepRow, describe, seconds } from './model';

export const SIDEBAR_ID = 'nbdurable-steps';

/** One row of the sidebar: a saved step (with its live cell, if matched) or another. */
export interface ISideRow {
  row: IStepRow;
  mark: IMark;
  /** Index of the live cell showing this step, if any. */
  cell: number | null;
}

/** The rows of a reply as the marks drew them: notebook order, then the others. */
export function sideRows(drawn: IMarksDrawn): ISideRow[] {
  const out: ISideRow[] = [];
  const seen = new Set<string>();
  for (const { row, mark, cell } of drawn.cells) {
    if (!seen.has(row.key)) {
      seen.add(row.key);
      out.push({ row, mark, cell });
    }
  }
  for (const row of drawn.reply?.cells ?? []) {
    if (!seen.has(row.key)) {
      seen.add(row.key);
      out.push({ row, mark: describe(row.state, row), cell: null });
    }
  }
  for (const row of drawn.reply?.others ?? []) {
    if (!seen.has(row.key)) {
      seen.add(row.key);
      out.push({ row, mark: describe(row.state, row), cell: null });
    }
  }
  return out;
}

/** ``["5 recorded", "1 running", "2 pending"]``: how many rows are in each state. */
export function counts(rows: ISideRow[]): string[] {
  const n = new Map<string, number>();
  for (const r of rows) {
    n.set(r.mark.state, (n.get(r.mark.state) ?? 0) + 1);
  }
  return [...n.entries()].map(([state, k]) => `${k} ${state}`);
}

/** What the sidebar's buttons ask of the server (nbdurable.server.marks.ACTIONS). */
export type Action = 'pin' | 'unpin' | 'clear' | 'clear-all' | 'approve' | 'reject';

/** Send one action for ``panel``'s notebook; the line the CLI would print. */
export async function postAction(
  panel: NotebookPanel,
  action: Action,
  key: string | null,
  reason = ''
): Promise<string> {
  const init = {
    method: 'POST',
    body: JSON.stringify({ path: panel.context.localPath, action, key, reason })
  };
  const body = await request('', init);
  return String(body.message ?? '');
}

/** The endpoint's JSON answer to ``init`` at ``nbdurable/api/steps<query>``; throws its message. */
async function request(query: string, init: RequestInit): Promise<any> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'nbdurable/api/steps') + query;
  const response = await ServerConnection.makeRequest(url, init, settings);
  let body: any = {};
  try {
    body = await response.json();
  } catch {
    // not our JSON: the server extension is not enabled
  }
  if (!response.ok) {
    throw new Error(body.message ?? `HTTP ${response.status}`);
  }
  return body;
}

/** ``GET nbdurable/api/steps?path=...&<query>`` for ``panel``'s notebook, as JSON. */
export async function getJSON(panel: NotebookPanel, query: string): Promise<any> {
  const path = encodeURIComponent(panel.context.localPath);
  return request(`?path=${path}&${query}`, {});
}

/** One run of the store, as the Runs section lists it. */
export interface IRunRow {
  run: string;
  parent: string | null;
  steps: number;
  last: number | null;
}

/** Ask before a clear that makes calls again; true to go on. */
export async function confirmClear(label: string | null, substeps: number): Promise<boolean> {
  if (label !== null && substeps === 0) {
    return true;
  }
  const body =
    label === null
      ? 'Every step and sub-step of this run is forgotten, pins included: the next run ' +
        'executes them all again and makes their calls again.'
      : `Step ${label} and its ${substeps} recorded sub-step${substeps === 1 ? '' : 's'} ` +
        'are forgotten: the next run makes those calls again.';
  const result = await showDialog({
    title: label === null ? 'Clear the whole run?' : `Clear step ${label}?`,
    body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Clear' })]
  });
  return result.button.accept;
}

export class StepsSidebar extends Widget {
  constructor(marksOf: (panel: NotebookPanel) => CellMarks | undefined) {
    super();
    this._marksOf = marksOf;
    this.id = SIDEBAR_ID;
    this.addClass('nbd-sidebar');
    this.title.label = 'Steps';
    this.title.caption = 'nbdurable: the steps of the active notebook';
    this.node.tabIndex = 0;
    this._draw();
  }

  /** Follow ``panel`` (null: no notebook is active). */
  follow(panel: NotebookPanel | null): void {
    // The tracker may make a notebook current before its marks exist: follow it again then.
    if (panel === this._panel && (panel === null || this._marks !== undefined)) {
      return;
    }
    this._marks?.drawn.disconnect(this._draw, this);
    this._panel = panel;
    this._marks = panel ? this._marksOf(panel) : undefined;
    this._marks?.drawn.connect(this._draw, this);
    this._message = '';
    this._runs = null;
    this._compared = null;
    this._draw();
    this._marks?.refetch();
  }

  /** Open the Runs section (reading the store's runs), or close it. */
  async toggleRuns(): Promise<void> {
    const panel = this._panel;
    if (this._runs !== null || panel === null) {
      this._runs = null;
      this._compared = null;
      this._draw();
      return;
    }
    try {
      const body = await getJSON(panel, 'runs=1');
      this._runs = (body.runs ?? []) as IRunRow[];
    } catch (reason) {
      this._message = `nbdurable: ${(reason as Error).message}`;
      this._runs = null;
    }
    this._draw();
  }

  private async _compare(other: string): Promise<void> {
    const panel = this._panel;
    if (panel === null) {
      return;
    }
    try {
      this._compared = await getJSON(panel, `compare=${encodeURIComponent(other)}`);
    } catch (reason) {
      this._message = `nbdurable: ${(reason as Error).message}`;
    }
    this._draw();
  }

  protected onAfterShow(): void {
    this._marks?.refetch();
    this._draw();
  }

  private async _act(
    action: Action,
    key: string | null,
    label: string | null,
    substeps: number,
    why = ''
  ): Promise<void> {
    const panel = this._panel;
    if (panel === null) {
      return;
    }
    if ((action === 'clear' || action === 'clear-all') && !(await confirmClear(label, substeps))) {
      return;
    }
    try {
      this._message = await postAction(panel, action, key, why);
      if (key !== null) {
        this._reasons.delete(key);
      }
    } catch (reason) {
      this._message = `nbdurable: ${(reason as Error).message}`;
    }
    this._marks?.refetch();
    this._draw();
  }

  private _draw(): void {
    const node = this.node;
    const panel = this._panel;
    const drawn = this._marks?.current();
    // Redrawn only when what it shows changed: a poll that brings nothing new leaves
    // the DOM (a button under the pointer, the scroll position) alone.
    const key = JSON.stringify([
      panel?.context.localPath ?? null,
      drawn ? sideRows(drawn).map(r => [r.row, r.mark, r.cell]) : null,
      drawn?.reply?.run,
      drawn?.reply?.approvals ?? [],
      drawn?.error,
      this._message,
      this._runs,
      this._compared
    ]);
    if (key === this._drawnKey) {
      return;
    }
    this._drawnKey = key;
    node.replaceChildren();
    const head = el('div', 'nbd-side-head');
    node.appendChild(head);
    if (panel === null || drawn === undefined) {
      head.appendChild(el('div', 'nbd-side-empty', 'Open a notebook to see its steps.'));
      return;
    }
    const rows = sideRows(drawn);
    head.appendChild(el('div', 'nbd-side-title', panel.context.localPath));
    if (drawn.error) {
      head.appendChild(el('div', 'nbd-side-problem', `cannot read the steps: ${drawn.error}`));
    }
    if (drawn.reply !== null) {
      const facts = el('div', 'nbd-side-facts');
      facts.appendChild(el('span', 'nbd-side-fact nbd-side-run', `run ${drawn.reply.run}`));
      for (const part of counts(rows)) {
        facts.appendChild(el('span', 'nbd-side-fact', part));
      }
      const saved = rows.reduce((s, r) => s + (r.row.recorded_at ? r.row.duration : 0), 0);
      if (saved > 0) {
        facts.appendChild(el('span', 'nbd-side-fact', `${seconds(saved)} of work recorded`));
      }
      head.appendChild(facts);
      const tools = el('div', 'nbd-side-buttons');
      const runs = button(
        this._runs === null ? 'Runs…' : 'Close runs',
        "The store's runs and forks; compare this run with one"
      );
      runs.classList.add('nbd-side-runs-button');
      runs.onclick = () => void this.toggleRuns();
      tools.appendChild(runs);
      if (rows.some(r => r.row.recorded_at || r.row.substeps)) {
        const all = button('Clear all…', 'Forget every record of this run (asks first)');
        all.classList.add('nbd-side-clear-all');
        all.onclick = () => void this._act('clear-all', null, null, 0);
        tools.appendChild(all);
      }
      head.appendChild(tools);
      if (this._runs !== null) {
        head.appendChild(this._runsSection(drawn.reply.run));
      }
    }
    if (this._message) {
      head.appendChild(el('div', 'nbd-side-message', this._message));
    }
    const asked = drawn.reply?.approvals ?? [];
    if (asked.length) {
      node.appendChild(this._approvals(asked));
    }
    if (!rows.length) {
      node.appendChild(
        el('div', 'nbd-side-empty', 'No %%step cells in this notebook (or not saved yet).')
      );
      return;
    }
    const list = el('ul', 'nbd-side-rows');
    for (const r of rows) {
      list.appendChild(this._row(panel, r));
    }
    node.appendChild(list);
  }

  /** The pending approvals, each with Approve, and Reject with a reason. */
  private _approvals(asked: IApproval[]): HTMLElement {
    const box = el('div', 'nbd-side-approvals');
    box.appendChild(el('div', 'nbd-side-approvals-head', 'Waiting for a decision'));
    for (const a of asked) {
      // STEP-KEY/ID names it even when two steps ask under the same id.
      const name = `${a.scope}/${a.id}`;
      const item = el('div', 'nbd-side-approval');
      item.dataset.nbdApproval = a.id;
      item.appendChild(el('div', 'nbd-side-approval-summary', a.summary));
      const where = [a.step ? `step ${a.step}` : 'outside any step', `id ${a.id}`];
      if (a.asked_on) {
        where.push(`asked on ${a.asked_on}`);
      }
      item.appendChild(el('div', 'nbd-side-facts', where.join(' · ')));
      if (a.again) {
        item.appendChild(el('div', 'nbd-side-detail', `asked again: ${a.again}`));
      }
      if (a.details) {
        item.appendChild(el('pre', 'nbd-side-approval-details', a.details));
      }
      const reason = document.createElement('input');
      reason.className = 'jp-mod-styled nbd-side-reason';
      reason.placeholder = 'reason (for a rejection)';
      reason.setAttribute('aria-label', `Reason for rejecting ${a.id}`);
      // Kept across redraws: a poll must not wipe what a person is typing.
      reason.value = this._reasons.get(name) ?? '';
      reason.oninput = () => this._reasons.set(name, reason.value);
      const buttons = el('div', 'nbd-side-buttons');
      const yes = button('Approve', `Approve: ${a.summary}`);
      yes.classList.add('nbd-side-approve');
      yes.onclick = () => void this._act('approve', name, null, 0);
      const no = button('Reject', `Reject (with the reason typed beside it): ${a.summary}`);
      no.classList.add('nbd-side-reject');
      no.onclick = () => void this._act('reject', name, null, 0, reason.value.trim());
      buttons.append(yes, no);
      item.append(reason, buttons);
      box.appendChild(item);
    }
    return box;
  }

  private _runsSection(current: string): HTMLElement {
    const box = el('div', 'nbd-side-runs');
    const runs = this._runs ?? [];
    if (!runs.length) {
      box.appendChild(el('div', 'nbd-side-empty', 'No run recorded in this store yet.'));
    }
    for (const r of runs) {
      const line = el('div', 'nbd-side-run-row');
      line.dataset.nbdRun = r.run;
      line.appendChild(el('span', 'nbd-side-label', r.run));
      const facts = [`${r.steps} step${r.steps === 1 ? '' : 's'}`];
      if (r.parent) {
        facts.unshift(`forked from ${r.parent}`);
      }
      if (r.run === current) {
        facts.unshift("this notebook's run");
      }
      line.appendChild(el('span', 'nbd-side-fact', facts.join(' · ')));
      if (r.run !== current) {
        const cmp = button('Compare', `Compare run ${current} with run ${r.run}, step by step`);
        cmp.classList.add('nbd-side-compare-button');
        cmp.onclick = () => void this._compare(r.run);
        line.appendChild(cmp);
      }
      box.appendChild(line);
    }
    const c = this._compared;
    if (c !== null) {
      const out = el('div', 'nbd-side-compare');
      const differ = (c.differ ?? []).length;
      out.appendChild(
        el('div', 'nbd-side-compare-head', `A ${c.a} · B ${c.b}: ${differ} of ${c.steps.length} steps differ`)
      );
      for (const s of c.steps ?? []) {
        const row = el(
          'div',
          'nbd-side-compare-step',
          `${s.verdict === 'same' ? '=' : '≠'} ${s.label}: ${s.verdict}`
        );
        row.dataset.nbdVerdict = s.verdict;
        out.appendChild(row);
        if ((s.lines ?? []).length) {
          out.appendChild(el('div', 'nbd-side-why', s.lines.join('\n')));
        }
      }
      box.appendChild(out);
    }
    return box;
  }

  private _row(panel: NotebookPanel, r: ISideRow): HTMLElement {
    const { row, mark } = r;
    const li = el('li', 'nbd-side-row');
    li.dataset.nbdKey = row.key;
    li.dataset.nbdState = mark.state;
    li.title = mark.title;
    const line = el('div', 'nbd-side-line');
    line.appendChild(el('span', 'nbd-mark-badge', mark.badge));
    const name = el('span', 'nbd-side-label', row.label);
    if (r.cell !== null) {
      const index = r.cell;
      name.classList.add('nbd-side-link');
      name.onclick = () => {
        panel.content.activeCellIndex = index;
        panel.content.activeCell?.node.scrollIntoView({ block: 'center' });
      };
      line.appendChild(name);
      line.appendChild(el('span', 'nbd-side-cell', `cell ${index + 1}`));
    } else {
      line.appendChild(name);
    }
    li.appendChild(line);
    const facts = [...mark.facts];
    if (row.tokens) {
      facts.push(`${row.tokens.toLocaleString('en-US')} tokens`);
    }
    if (facts.length) {
      const f = el('div', 'nbd-side-facts');
      facts.forEach(text => f.appendChild(el('span', 'nbd-side-fact', text)));
      li.appendChild(f);
    }
    if (mark.detail) {
      li.appendChild(el('div', 'nbd-side-detail', mark.detail));
    }
    if (mark.why.length) {
      li.appendChild(el('div', 'nbd-side-why', mark.why.join('\n')));
    }
    const buttons = el('div', 'nbd-side-buttons');
    if (row.recorded_at) {
      const pin = row.pinned
        ? button('Unpin', 'Let this step run again when its code or inputs change')
        : button('Pin', 'Replay this step even when its code or inputs change');
      pin.onclick = () => void this._act(row.pinned ? 'unpin' : 'pin', row.key, row.label, 0);
      buttons.appendChild(pin);
    }
    if (row.recorded_at || row.substeps) {
      const clear = button('Clear', 'Forget this step and its sub-steps: the next run executes it');
      clear.onclick = () => void this._act('clear', row.key, row.label, row.substeps);
      buttons.appendChild(clear);
    }
    if (buttons.childElementCount) {
      li.appendChild(buttons);
    }
    return li;
  }

  private _marksOf: (panel: NotebookPanel) => CellMarks | undefined;
  private _panel: NotebookPanel | null = null;
  private _marks: CellMarks | undefined;
  private _message = '';
  private _drawnKey = '';
  private _runs: IRunRow[] | null = null;
  private _compared: any = null;
  /** The reason typed for each pending approval, by ``SCOPE/ID``. */
  private _reasons = new Map<string, string>();
}

function el(tag: string, className: string, text?: string): HTMLElement {
  const e = document.createElement(tag);
  e.className = className;
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

function button(label: string, title: string): HTMLButtonElement {
  const b = document.createElement('button');
  b.className = 'jp-Button nbd-side-button';
  b.textContent = label;
  b.title = title;
  return b;
}

/**
 * The marks of one notebook: fetches the saved steps' states, matches them to
 * the cells, and draws one line in each %%step cell's header.
 *
 * When it asks the server: on open, after every save, when a run ends, when
 * the page becomes visible again, every second while the kernel is busy (so a
 * running step's sub-step counter moves), and every few seconds otherwise
 * (so a `nbdurable pin` from a terminal shows). It asks only for notebooks
 * holding a %%step cell. Local changes (an edit, outputs arriving) redraw
 * without asking.
 */

import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Cell, ICodeCellModel } from '@jupyterlab/cells';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { Signal } from '@lumino/signaling';

import { ICellView, IMark, IStepRow, IStepsReply, markFor, matchCells, parseStep } from './model';
import { PanelKeeper } from './panels';

/** What the marks of one notebook show now: the sidebar draws the same. */
export interface IMarksDrawn {
  reply: IStepsReply | null;
  /** Why the server could not answer ('' when it did). */
  error: string;
  /** Each live %%step cell matched to a saved step: its row, its mark, its index. */
  cells: { row: IStepRow; mark: IMark; cell: number }[];
}

/** Milliseconds between two questions while the kernel is busy, and otherwise. */
const BUSY_POLL = 1000;
const IDLE_POLL = 10000;
const ERROR_POLL = 30000;

const MARK_CLASS = 'nbd-mark';
/** On the cell header holding a mark: the header, empty and 0 px high otherwise, grows. */
const HOST_CLASS = 'nbd-mark-host';

export class CellMarks {
  constructor(panel: NotebookPanel) {
    this._panel = panel;
    const ctx = panel.context;
    ctx.saveState.connect(this._onSave, this);
    ctx.fileChanged.connect(this._refetch, this);
    panel.sessionContext.statusChanged.connect(this._onStatus, this);
    panel.sessionContext.kernelChanged.connect((_, args) => {
      if (args.oldValue) {
        this._keeper.kernelRestarted(panel.content.widgets, panel.context.model);
        this._redraw();
      }
    });
    NotebookActions.executionScheduled.connect(this._onScheduled, this);
    NotebookActions.executed.connect(this._onExecuted, this);
    document.addEventListener('visibilitychange', this._onVisible);
    void ctx.ready.then(() => {
      if (this._disposed) {
        return;
      }
      panel.model?.contentChanged.connect(this._redraw, this);
      panel.content.modelContentChanged.connect(this._redraw, this);
      this._refetch();
      // A widget that cannot be restored says so only once the widget manager
      // has tried, a moment after the notebook opens: look again then.
      for (const ms of [1500, 4000]) {
        window.setTimeout(() => this._redraw(), ms);
      }
    });
    panel.disposed.connect(() => this.dispose());
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    Signal.clearData(this);
    window.clearTimeout(this._timer);
    window.clearTimeout(this._drawTimer);
    document.removeEventListener('visibilitychange', this._onVisible);
    NotebookActions.executionScheduled.disconnect(this._onScheduled, this);
    NotebookActions.executed.disconnect(this._onExecuted, this);
  }

  /** Emitted after every draw (a new answer, an edit, a cell run). */
  get drawn(): Signal<this, void> {
    return this._drawnSignal;
  }

  /** What the marks show now. */
  current(): IMarksDrawn {
    return { reply: this._reply, error: this._error, cells: this._cells };
  }

  /** Ask the server now (an action changed the store), then go on polling. */
  refetch(): void {
    this._refetch();
  }

  /** Whether the marks are drawn in the cells (the setting); their data is kept either way. */
  setShown(shown: boolean): void {
    if (shown !== this._shown) {
      this._shown = shown;
      this._draw();
    }
  }

  /** Ask the server now, then go on polling. */
  private _refetch(): void {
    window.clearTimeout(this._timer);
    // Only the latest question schedules the next one: an answer to an older
    // one (asked while the kernel was idle) must not slow a busy poll down.
    const generation = ++this._generation;
    void this._fetch().then(ok => {
      if (!this._disposed && generation === this._generation) {
        const delay = !ok ? ERROR_POLL : this._isBusy() ? BUSY_POLL : IDLE_POLL;
        this._timer = window.setTimeout(() => this._refetch(), delay);
      }
    });
  }

  /** The kernel is busy, or a cell waits for it. */
  private _isBusy(): boolean {
    return (
      this._panel.sessionContext.session?.kernel?.status === 'busy' ||
      this._runningId(this._panel.content.widgets) !== null
    );
  }

  /** Fetch and draw; false if the server could not answer. */
  private async _fetch(): Promise<boolean> {
    if (document.hidden) {
      return true;
    }
    if (!this._hasSteps()) {
      this._reply = null;
      this._draw();
      return true;
    }
    const settings = ServerConnection.makeSettings();
    const url =
      URLExt.join(settings.baseUrl, 'nbdurable/api/steps') +
      '?path=' +
      encodeURIComponent(this._panel.context.localPath);
    try {
      const response = await ServerConnection.makeRequest(url, {}, settings);
      if (!response.ok) {
        let message = `HTTP ${response.status}`;
        try {
          message = (await response.json()).message ?? message;
        } catch {
          // not our JSON: the server extension is not enabled
        }
        this._problem(message);
        return false;
      }
      this._reply = (await response.json()) as IStepsReply;
      this._error = '';
    } catch (reason) {
      this._problem(String(reason));
      return false;
    }
    this._draw();
    return true;
  }

  private _problem(message: string): void {
    if (message !== this._error) {
      console.warn(`nbdurable: cannot read the steps' states: ${message}`);
    }
    this._error = message;
  }

  private _hasSteps(): boolean {
    const cells = this._panel.content.widgets;
    return (
      cells.some(c => c.model.type === 'code' && parseStep(c.model.sharedModel.getSource())) ||
      (this._reply?.cells.length ?? 0) > 0
    );
  }

  private _onSave(_: unknown, state: string): void {
    if (state === 'completed') {
      this._refetch();
    }
  }

  private _onStatus(): void {
    const status = this._panel.sessionContext.session?.kernel?.status;
    const was = this._lastStatus;
    this._lastStatus = status;
    // 'starting' right after a running kernel: restarted from elsewhere (the REST API).
    const restart =
      status === 'restarting' ||
      status === 'autorestarting' ||
      (status === 'starting' && (was === 'idle' || was === 'busy'));
    if (restart) {
      this._keeper.kernelRestarted(this._panel.content.widgets, this._panel.context.model);
      this._redraw();
    }
    if (status === 'busy' && !this._busy) {
      this._busy = true;
      this._refetch();
    } else if (status !== 'busy' && this._busy) {
      this._busy = false;
      this._refetch();
    }
  }

  private _onScheduled(_: unknown, args: { notebook: unknown; cell: Cell }): void {
    if (args.notebook === this._panel.content) {
      this._scheduled.set(args.cell.model.id, ++this._order);
      this._redraw();
    }
  }

  private _onExecuted(_: unknown, args: { notebook: unknown; cell: Cell }): void {
    if (args.notebook === this._panel.content) {
      this._scheduled.delete(args.cell.model.id);
      this._redraw();
    }
  }

  private _onVisible = (): void => {
    if (!document.hidden) {
      this._refetch();
    }
  };

  /** Redraw soon (many edits and outputs make one redraw). */
  private _redraw(): void {
    window.clearTimeout(this._drawTimer);
    this._drawTimer = window.setTimeout(() => this._draw(), 150);
  }

  /** The cell the kernel runs now: of those waiting for the kernel, the first one sent. */
  private _runningId(cells: readonly Cell[]): string | null {
    let best: string | null = null;
    let bestOrder = Infinity;
    cells.forEach((cell, i) => {
      if (cell.model.type !== 'code') {
        return;
      }
      const model = cell.model as ICodeCellModel;
      // JupyterLab >= 4.1 keeps the state on the model; before, the scheduled set.
      const waiting =
        model.executionState !== undefined
          ? model.executionState === 'running'
          : this._scheduled.has(model.id);
      const order = this._scheduled.get(model.id) ?? 1e9 + i;
      if (waiting && order < bestOrder) {
        best = model.id;
        bestOrder = order;
      }
    });
    return best;
  }

  private _draw(): void {
    if (this._disposed) {
      return;
    }
    const cells = this._panel.content.widgets;
    const running = this._runningId(cells);
    const views: ICellView[] = cells.map(cell => ({
      id: cell.model.id,
      source: cell.model.type === 'code' ? cell.model.sharedModel.getSource() : '',
      running: cell.model.id === running,
      replayedKey: cell.model.type === 'code' ? replayNote(cell.model as ICodeCellModel) : null
    }));
    const rows = this._reply ? matchCells(views, this._reply.cells) : views.map(() => undefined);
    const marks = rows.map((row, i) => (row === undefined ? undefined : markFor(views[i], row)));
    this._cells = [];
    rows.forEach((row, i) => {
      if (row) {
        this._cells.push({ row, mark: marks[i]!, cell: i });
      }
    });
    cells.forEach((cell, i) => {
      const row = this._shown ? rows[i] : undefined;
      const host = cell.node.querySelector(':scope > .jp-CellHeader') as HTMLElement | null;
      if (host === null) {
        // A cell not rendered yet (JupyterLab renders long notebooks lazily).
        if (!this._waiting.has(cell)) {
          this._waiting.add(cell);
          void cell.ready.then(() => this._redraw());
        }
        return;
      }
      let node = host.querySelector(`:scope > .${MARK_CLASS}`) as HTMLElement | null;
      if (row === undefined) {
        node?.remove();
        host.classList.remove(HOST_CLASS);
        return;
      }
      if (node === null) {
        node = document.createElement('div');
        node.className = MARK_CLASS;
        host.appendChild(node);
        host.classList.add(HOST_CLASS);
      }
      render(node, marks[i]!);
    });
    this._keeper.draw(cells, this._reply);
    this._drawnSignal.emit();
  }

  private _panel: NotebookPanel;
  private _reply: IStepsReply | null = null;
  private _error = '';
  private _busy = false;
  private _lastStatus: string | undefined;
  private _disposed = false;
  private _timer = 0;
  private _generation = 0;
  private _drawTimer = 0;
  private _order = 0;
  private _scheduled = new Map<string, number>();
  private _waiting = new WeakSet<Cell>();
  private _keeper = new PanelKeeper();
  private _cells: IMarksDrawn['cells'] = [];
  private _shown = true;
  private _drawnSignal = new Signal<this, void>(this);
}

/** The step key of the replay note nbdurable puts among a replayed cell's outputs. */
function replayNote(model: ICodeCellModel): string | null {
  const outputs = model.outputs;
  for (let i = 0; i < outputs.length; i++) {
    const meta = outputs.get(i).metadata as any;
    const note = meta && meta.nbdurable;
    if (note && note.note === 'replayed' && typeof note.step === 'string') {
      return note.step;
    }
  }
  return null;
}

function span(className: string, text: string): HTMLElement {
  const s = document.createElement('span');
  s.className = className;
  s.textContent = text;
  return s;
}

function render(node: HTMLElement, mark: ReturnType<typeof markFor>): void {
  const key = JSON.stringify(mark);
  if (node.dataset.nbdDrawn === key) {
    return; // unchanged: leave the DOM alone
  }
  node.dataset.nbdDrawn = key;
  node.dataset.nbdState = mark.state;
  if (mark.key) {
    node.dataset.nbdKey = mark.key;
  } else {
    delete node.dataset.nbdKey;
  }
  node.title = mark.title;
  node.replaceChildren(
    span('nbd-mark-badge', mark.badge),
    ...mark.facts.map(f => span('nbd-mark-fact', f)),
    ...(mark.detail ? [span('nbd-mark-detail', mark.detail)] : [])
  );
}

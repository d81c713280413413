/**
 * What a %%step cell's mark says: pure functions, no DOM, no Jupyter objects.
 *
 * The server (nbdurable.server.marks) sends the state of every %%step cell of
 * the *saved* notebook, read from the store with no kernel. This module matches
 * the cells the frontend holds now to those saved cells, and adds what only the
 * frontend knows: a cell runs now, its last run replayed (its outputs carry the
 * replay note), or its source differs from the saved one (edited, not saved).
 */

import vocabulary from './vocabulary.json';

/** One saved %%step cell and its state, as GET /nbdurable/api/steps sends it. */
export interface IStepRow {
  key: string;
  label: string;
  state: string;
  detail: string;
  recorded_at: number | null;
  duration: number;
  substeps: number;
  calls: number;
  /** Tokens the step's model replies reported: what its replay saves. */
  tokens: number;
  pinned: boolean;
  stale: boolean;
  replayable: boolean;
  /** Position in the saved notebook (0-based). */
  index: number;
  /** Saved cell id; null when the file's format does not keep ids (nbformat < 4.5). */
  cell_id: string | null;
  name: string | null;
  /** The saved source after the %%step line. */
  body: string;
  /** What exactly changed (old and new value, code lines), under ``detail``. */
  why?: string[];
}

/** An approval waiting for a person's decision (nbdurable.approvals.Pending). */
export interface IApproval {
  id: string;
  /** The step's label ("" outside any step) and key (the scope). */
  step: string;
  scope: string;
  summary: string;
  details: string;
  /** When it was asked (server seconds) and on which machine. */
  asked: number;
  asked_on: string;
  /** Why it was asked again ("" the first time): what changed since the last decision. */
  again: string;
}

/** The server's answer. */
export interface IStepsReply {
  run: string;
  store: string;
  store_exists: boolean;
  cells: IStepRow[];
  /** Steps no longer in the notebook, and sub-steps outside steps (no cell fields). */
  others: IStepRow[];
  /** The run's approvals waiting for a decision, the longest waiting first. */
  approvals?: IApproval[];
}

/** A cell as the frontend holds it now. */
export interface ICellView {
  id: string;
  source: string;
  /** The kernel runs this cell now. */
  running: boolean;
  /** The step key of the replay note among the cell's outputs, if any. */
  replayedKey: string | null;
}

/** What a mark shows. */
export interface IMark {
  state: string;
  key: string | null;
  badge: string;
  facts: string[];
  detail: string;
  /** What exactly changed, a few short lines (nbdurable/why.py). */
  why: string[];
  title: string;
}

/**
 * The %step commands, the step-name rule and the states, as nbdurable defines
 * them (nbdurable/states.py): vocabulary.json is written by
 * `python -m nbdurable.states`, and a test checks that it, and this build, agree.
 */
const STEP_COMMANDS: string[] = vocabulary.commands;
const STEP_LINE = /^\s*%%step\b(.*)$/;
const NAME = new RegExp(`^(?:${vocabulary.name_pattern})$`);

/** A %%step cell's name and body; null when the source is not a step the magic accepts. */
export function parseStep(source: string): { name: string | null; body: string } | null {
  const cut = source.indexOf('\n');
  const first = cut < 0 ? source : source.slice(0, cut);
  const body = cut < 0 ? '' : source.slice(cut + 1);
  const m = STEP_LINE.exec(first);
  if (!m) {
    return null;
  }
  const args = m[1]
    .trim()
    .split(/\s+/)
    .filter(a => a && a !== '--force' && a !== '-f')
    .map(a => a.replace(/^(['"])(.*)\1$/, '$2'));
  if (args.length > 1 || args.some(a => a.startsWith('-'))) {
    return null;
  }
  if (args.length === 1 && (STEP_COMMANDS.includes(args[0]) || !NAME.test(args[0]))) {
    return null;
  }
  return { name: args.length ? args[0] : null, body };
}

function same(a: string, b: string): boolean {
  return a.replace(/\s+$/, '') === b.replace(/\s+$/, '');
}

/**
 * The saved row of each cell (null: a step cell not in the saved notebook;
 * undefined: not a step cell). A cell is found by its saved id, else by its
 * step name, else (for files without ids) by its saved source, else by its
 * position: the order in which nbdurable itself keys a step is name, cell id,
 * position (identity/keys.py), and the name wins over the id there too.
 */
export function matchCells(
  cells: ICellView[],
  rows: IStepRow[]
): (IStepRow | null | undefined)[] {
  const used = new Set<IStepRow>();
  const parsed = cells.map(c => parseStep(c.source));
  const out: (IStepRow | null | undefined)[] = cells.map(() => undefined);
  const pick = (i: number, row: IStepRow | undefined): boolean => {
    if (row === undefined) {
      return false;
    }
    out[i] = row;
    used.add(row);
    return true;
  };
  // By id, then by name: exact identities first, so that they are not taken
  // by a weaker match of another cell.
  cells.forEach((cell, i) => {
    const p = parsed[i];
    if (p) {
      pick(i, rows.find(r => r.cell_id !== null && r.cell_id === cell.id));
    }
  });
  parsed.forEach((p, i) => {
    if (p && out[i] === undefined && p.name !== null) {
      pick(i, rows.find(r => r.name === p.name));
    }
  });
  const free = (r: IStepRow) => r.cell_id === null && !used.has(r);
  parsed.forEach((p, i) => {
    if (p && out[i] === undefined) {
      pick(i, rows.find(r => free(r) && r.name === null && same(r.body, p.body))) ||
        pick(i, rows.find(r => free(r) && r.index === i));
    }
  });
  parsed.forEach((p, i) => {
    if (p && out[i] === undefined) {
      out[i] = null;
    }
  });
  return out;
}

/** True when the cell's source differs from the saved cell's. */
export function isEdited(cell: ICellView, row: IStepRow): boolean {
  const p = parseStep(cell.source);
  return p === null || p.name !== row.name || !same(p.body, row.body);
}

const STATES: { [state: string]: { glyph: string; next_run: string } } = vocabulary.states;
const LOOK: { [state: string]: string } = Object.fromEntries(
  Object.entries(STATES).map(([name, s]) => [name, `${s.glyph} ${name}`])
);
const WHAT: { [state: string]: string } = Object.fromEntries(
  Object.entries(STATES).map(([name, s]) => [name, s.next_run])
);

/** ``14:02`` today, else ``2026-11-30 14:02``. */
export function when(t: number, now: Date = new Date()): string {
  const d = new Date(t * 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
  if (d.toDateString() === now.toDateString()) {
    return hm;
  }
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${hm}`;
}

/** ``0.04 s``, ``12.3 s``, ``4 min 5 s``, ``1 h 3 min``: as nbdurable.text.seconds writes it. */
export function seconds(s: number): string {
  if (s < 0.1) {
    return `${s.toFixed(2)} s`;
  }
  if (s < 60) {
    return `${s.toFixed(1)} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function plural(n: number, what: string): string {
  return `${n} ${what}${n === 1 ? '' : 's'}`;
}

/** The mark of one step cell; ``row`` is its saved row (null: not in the saved notebook). */
export function markFor(cell: ICellView, row: IStepRow | null): IMark {
  const edited = row === null || isEdited(cell, row);
  let state: string;
  if (cell.running) {
    // A running cell whose step the store says waits for an approval is not
    // computing: it waits for a person (the server names the approval).
    state = row !== null && row.state === 'waiting' ? 'waiting' : 'running';
  } else if (edited) {
    state = 'edited';
  } else if (row!.state === 'recorded' && cell.replayedKey === row!.key) {
    state = 'replayed';
  } else {
    state = row!.state;
  }
  return describe(state, row, !edited);
}

/** What a mark of ``state`` says of ``row``; ``same`` when the row is this very cell's. */
export function describe(state: string, row: IStepRow | null, same = true): IMark {
  const facts: string[] = [];
  let detail = '';
  let why: string[] = [];
  if (state === 'running') {
    if (row !== null && same) {
      // With a previous record, how far along: "14 of 25 sub-steps".
      facts.push(
        row.recorded_at && row.calls > 0 && row.substeps <= row.calls
          ? `${row.substeps} of ${row.calls} sub-steps`
          : `${plural(row.substeps, 'sub-step')} recorded`
      );
    }
  } else if (state === 'edited') {
    facts.push('not saved');
    if (row !== null) {
      facts.push(`saved cell: ${row.state}`);
    }
  } else if (row !== null) {
    if (row.recorded_at && state !== 'pending') {
      facts.push(`${state === 'replayed' ? 'recorded ' : ''}${when(row.recorded_at)}`);
      facts.push(state === 'replayed' ? `saved ${seconds(row.duration)}` : seconds(row.duration));
      if (row.calls) {
        facts.push(plural(row.calls, 'call'));
      }
    }
    detail = row.detail;
    if (state === 'pinned' && detail) {
      detail = `stale: ${detail}`;
    }
    if (detail && (state === 'invalidated' || state === 'pinned')) {
      why = row.why ?? [];
    }
  }
  const title = [
    row ? `step ${row.label}` : 'step (not saved yet)',
    WHAT[state] ?? '',
    detail,
    ...why,
    row && row.substeps ? `${plural(row.substeps, 'sub-step')} recorded.` : ''
  ]
    .filter(s => s)
    .join('\n');
  return {
    state,
    key: row ? row.key : null,
    badge: LOOK[state] ?? state,
    facts,
    detail,
    why,
    title
  };
}

/**
 * nbdurable's frontend extension, for JupyterLab 4 and Notebook 7 (both give
 * the notebook tracker):
 *
 * - every %%step cell shows its state next to it (the cell marks);
 * - the Steps side panel shows the active notebook's steps, with Pin / Clear
 *   (opened from the command palette, the View menu and the notebook toolbar);
 * - the cell menu pins, unpins, clears the step at the cursor, or says why it
 *   will run.
 *
 * The states come from the server extension (`GET /nbdurable/api/steps`),
 * which reads the store with no kernel, so they are there as soon as a
 * notebook opens; the actions go to the same endpoint (`POST`), which runs the
 * CLI's own commands. Settings (the registry's "nbdurable"): which side the
 * panel opens on, and whether the marks show in the cells.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ICommandPalette, ToolbarButton, showDialog } from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { Widget } from '@lumino/widgets';

import { CellMarks } from './marks';
import { SIDEBAR_ID, StepsSidebar, confirmClear, postAction } from './sidebar';

const PLUGIN_ID = 'nbdurable:plugin';

const COMMANDS = {
  show: 'nbdurable:show-steps',
  pin: 'nbdurable:pin-step',
  unpin: 'nbdurable:unpin-step',
  clear: 'nbdurable:clear-step',
  why: 'nbdurable:why-step'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Marks each %%step cell with its nbdurable state; the Steps side panel.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, IMainMenu, ISettingRegistry, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    menu: IMainMenu | null,
    registry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null
  ) => {
    const marks = new WeakMap<NotebookPanel, CellMarks>();
    let side: 'left' | 'right' = 'right';
    let shown = true;
    const sidebar = new StepsSidebar(panel => marks.get(panel));
    const place = () => {
      app.shell.add(sidebar, side, { rank: 900 });
    };

    const adopt = (panel: NotebookPanel) => {
      const m = new CellMarks(panel);
      m.setShown(shown);
      marks.set(panel, m);
      if (tracker.currentWidget === panel) {
        sidebar.follow(panel);
      }
      panel.toolbar.insertItem(
        10,
        'nbdurableSteps',
        new ToolbarButton({
          label: 'Steps',
          tooltip: 'nbdurable: show the steps of this notebook',
          onClick: () => void app.commands.execute(COMMANDS.show)
        })
      );
    };
    tracker.forEach(adopt);
    tracker.widgetAdded.connect((_, panel) => adopt(panel));
    tracker.currentChanged.connect((_, panel) => sidebar.follow(panel));
    sidebar.follow(tracker.currentWidget);
    place();
    restorer?.add(sidebar, SIDEBAR_ID); // open again after a reload if it was open

    app.commands.addCommand(COMMANDS.show, {
      label: 'Show nbdurable Steps',
      caption: 'The steps of the active notebook: states, Pin, Clear',
      execute: () => {
        if (!sidebar.isAttached) {
          place();
        }
        app.shell.activateById(SIDEBAR_ID);
      }
    });

    /** The step row of the cell right-clicked, else of the active cell; null: none known. */
    const atCursor = () => {
      const panel = tracker.currentWidget;
      const m = panel ? marks.get(panel) : undefined;
      if (!panel || !m) {
        return null;
      }
      let index = panel.content.activeCellIndex;
      const hit = app.contextMenuHitTest(node => node.classList.contains('jp-Cell'));
      if (hit) {
        const i = panel.content.widgets.findIndex(w => w.node === hit);
        index = i >= 0 ? i : index;
      }
      const found = m.current().cells.find(c => c.cell === index);
      return found ? { panel, marks: m, ...found } : null;
    };
    const act = async (action: 'pin' | 'unpin' | 'clear') => {
      const at = atCursor();
      if (at === null) {
        return;
      }
      if (action === 'clear' && !(await confirmClear(at.row.label, at.row.substeps))) {
        return;
      }
      let message: string;
      try {
        message = await postAction(at.panel, action, at.row.key);
      } catch (reason) {
        message = (reason as Error).message;
      }
      at.marks.refetch();
      void showDialog({
        title: 'nbdurable',
        body: message,
        buttons: [Dialog.okButton()]
      });
    };
    const recorded = () => Boolean(atCursor()?.row.recorded_at);
    app.commands.addCommand(COMMANDS.pin, {
      label: 'Pin Step',
      caption: 'Replay the step at the cursor even when its code or inputs change',
      isEnabled: () => recorded() && !atCursor()?.row.pinned,
      execute: () => act('pin')
    });
    app.commands.addCommand(COMMANDS.unpin, {
      label: 'Unpin Step',
      isEnabled: () => Boolean(atCursor()?.row.pinned),
      execute: () => act('unpin')
    });
    app.commands.addCommand(COMMANDS.clear, {
      label: 'Clear Step…',
      caption: 'Forget the step at the cursor and its sub-steps: the next run executes it',
      isEnabled: () => {
        const at = atCursor();
        return Boolean(at && (at.row.recorded_at || at.row.substeps));
      },
      execute: () => act('clear')
    });
    app.commands.addCommand(COMMANDS.why, {
      label: 'Why Does This Step Run?',
      caption: 'What the next run does with the step at the cursor, and why',
      isEnabled: () => atCursor() !== null,
      execute: () => {
        const at = atCursor();
        if (at === null) {
          return;
        }
        // One line per fact, the changed values and code lines as written.
        const body = document.createElement('div');
        body.className = 'nbd-why-dialog';
        body.textContent = at.mark.title;
        void showDialog({
          title: `Step ${at.row.label}: ${at.mark.badge}`,
          body: new Widget({ node: body }),
          buttons: [Dialog.okButton()]
        });
      }
    });

    for (const command of Object.values(COMMANDS)) {
      palette?.addItem({ command, category: 'nbdurable' });
    }
    menu?.viewMenu.addGroup([{ command: COMMANDS.show }], 100);
    [COMMANDS.why, COMMANDS.pin, COMMANDS.unpin, COMMANDS.clear].forEach((command, i) =>
      app.contextMenu.addItem({ command, selector: '.jp-Notebook .jp-CodeCell', rank: 90 + i })
    );

    if (registry) {
      void registry.load(PLUGIN_ID).then(settings => {
        const apply = () => {
          const wanted = settings.get('side').composite === 'left' ? 'left' : 'right';
          shown = settings.get('marks').composite !== false;
          tracker.forEach(panel => marks.get(panel)?.setShown(shown));
          if (wanted !== side) {
            side = wanted;
            place();
          }
        };
        apply();
        settings.changed.connect(apply);
      });
    }
  }
};

export default plugin;

/**
 * nbdurable's frontend extension: every %%step cell shows its state next to it.
 *
 * Works in JupyterLab 4 and Notebook 7 (both give the notebook tracker). The
 * states come from the server extension (`GET /nbdurable/api/steps`), which
 * reads the store with no kernel, so the marks are there as soon as a
 * notebook opens.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';

import { CellMarks } from './marks';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbdurable:cell-marks',
  description: "Marks each %%step cell with its nbdurable state.",
  autoStart: true,
  requires: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker) => {
    tracker.forEach(panel => new CellMarks(panel));
    tracker.widgetAdded.connect((_, panel) => new CellMarks(panel));
  }
};

export default plugin;

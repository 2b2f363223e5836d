"""notebooks/explore.ipynb, executed headless by nbclient as CI and a user's Jupyter would, on the
checkpoints that ship with the package."""

import os

import pytest

from cli_helpers import ROOT
from xpress_jax import assets


@pytest.mark.pipeline
def test_the_notebook_tours_the_shipped_checkpoints_in_pictures():
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "explore.ipynb"), as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    # every plotting cell leaves a PNG: draft block, Jacobi iterations, accepted prefix, case study, tau vs iterations
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 5
    assert any("checkpoints from " + assets.ASSETS in o.get("text", "") for o in outputs)

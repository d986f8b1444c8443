"""In a real JupyterLab 4 and Notebook 7: the snippet box, the What-if rows and the saved line
show the Session's state after each action (see ``session_follow.py``)."""

from __future__ import annotations

import pytest

from tests.browser.session_follow import CELLS, views_follow_the_session

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _clean_saved_settings(no_saved_settings):
    """Each test starts without settings saved by an earlier test's Apply."""


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_views_follow_the_session(notebook_page, ui):
    views_follow_the_session(notebook_page(CELLS, ui=ui))

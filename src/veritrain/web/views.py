"""Page data for the run browser (`veritrain ui`) and the static site (`veritrain publish`), one module per page
(runs_table, run_page, compare_page, data_page, sweep_page; common: what they share). Plain functions from a
Workspace to dicts that the templates render; they only read the run folders, the data versions and the index
(`.veritrain/registry.sqlite`, a cache). No torch import. This module gathers them for the server and the site."""

from __future__ import annotations

from veritrain.core.errors import UserError as UserError
from veritrain.web.common import (  # noqa: F401
    MAX_DATA_ROWS as MAX_DATA_ROWS,
    OUTSIDE_KINDS as OUTSIDE_KINDS,
    VERSION_ID as VERSION_ID,
    run_dir_of as run_dir_of,
    safe_source as safe_source,
    visible_text as visible_text,
)
from veritrain.web.compare_page import (  # noqa: F401
    LABEL_KEYS as LABEL_KEYS,
    change_labels as change_labels,
    compare_page as compare_page,
)
from veritrain.web.data_page import (  # noqa: F401
    SPLITS as SPLITS,
    data_dir_of as data_dir_of,
    data_page as data_page,
)
from veritrain.web.run_page import (  # noqa: F401
    ENGINE_CHARTS as ENGINE_CHARTS,
    ENGINE_CURVES as ENGINE_CURVES,
    EVAL_IMAGES as EVAL_IMAGES,
    MAX_AUDITS as MAX_AUDITS,
    MAX_CSV_ROWS as MAX_CSV_ROWS,
    MAX_TRAJECTORY_ROWS as MAX_TRAJECTORY_ROWS,
    NOT_CURVES as NOT_CURVES,
    STEP_KEYS as STEP_KEYS,
    audits as audits,
    curves as curves,
    damaged_page as damaged_page,
    epoch_points as epoch_points,
    headline as headline,
    interrupted_amend as interrupted_amend,
    live_stamp as live_stamp,
    run_live as run_live,
    run_page as run_page,
    step_points as step_points,
    task_charts as task_charts,
    trajectory as trajectory,
    trust_lines as trust_lines,
    verdict_shown as verdict_shown,
)
from veritrain.web.runs_table import (  # noqa: F401
    DURATION_SQL as DURATION_SQL,
    FILTER_COLUMNS as FILTER_COLUMNS,
    GROUPS as GROUPS,
    INDEX_REFRESH_SECONDS as INDEX_REFRESH_SECONDS,
    MAX_GROUPS as MAX_GROUPS,
    MAX_METRIC_COLUMNS as MAX_METRIC_COLUMNS,
    METRIC_KEY as METRIC_KEY,
    NEWEST_WATCHED as NEWEST_WATCHED,
    OWN_COLUMNS as OWN_COLUMNS,
    PAGE_SIZE as PAGE_SIZE,
    SORT_COLUMNS as SORT_COLUMNS,
    TABLE_METRICS as TABLE_METRICS,
    default_columns as default_columns,
    differing_keys as differing_keys,
    metric_columns as metric_columns,
    param_value as param_value,
    progress as progress,
    runs_table as runs_table,
    table_columns as table_columns,
    table_live as table_live,
)
from veritrain.web.sweep_page import (  # noqa: F401
    SWEEP_ID as SWEEP_ID,
    experiments_page as experiments_page,
    recomputed_best as recomputed_best,
    searches_of as searches_of,
    sweep_page as sweep_page,
    sweeps_of as sweeps_of,
)

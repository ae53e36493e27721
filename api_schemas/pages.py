"""The largest page of each paged list endpoint: the server's bound on `limit` and the page
size the Python client and the CLI ask for, so that the two cannot disagree."""

# GET /experiments/{id}/runs
RUNS_PAGE = 1000
# GET /runs/{id}/metrics
POINTS_PAGE = 10_000
# GET /experiments/{id}/curves: runs in one request, and points of each run (the dashboard's
# bound on a curve, five pages of /runs/{id}/metrics)
CURVE_RUNS = 20
CURVE_POINTS = 5 * POINTS_PAGE
# GET /experiments/{id}/stats: comparisons in one page
COMPARISONS_PAGE = 2000
# GET /experiments
EXPERIMENTS_PAGE = 1000
# GET /compare: conditions in one page
COMPARE_PAGE = 200

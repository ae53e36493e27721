"""Analysis: the statistics, their sources and caches, reports and export."""

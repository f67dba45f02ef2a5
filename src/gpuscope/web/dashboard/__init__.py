"""The web dashboard: page data built from the hub's store and alerts, and the static pages.

The JSON views here shape data for one page each, so the browser makes one request per page
refresh instead of hundreds; time series still come from the hub's own ``/api/v1/series``.
"""

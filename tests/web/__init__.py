"""Tests of the web bridge, the page and the JavaScript client (issue 16)."""

"""What a run reports: the terminal summary (``summary``, ``counts``, ``root_causes``, ``coverage``), the JSON report
and
its HTML page (``json_report``, ``html_report``), runs across runners and over time (``shards``, ``ordering``,
``merge``, ``merge_cli``, ``merged_html``, ``baseline``, ``provenance``, ``environment``), what xdist workers hand their
controller (``transport``), the block pytest prints for a failure (``failure_block``) and ``--list-impls``.
"""

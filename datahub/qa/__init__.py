"""QA gates: Great Expectations suites (``schemas/gx``) run on a table version, recorded in
``qa_results``. A version whose latest result of any suite failed is not releasable.

Importing this package does not import great_expectations; running a suite does.
"""

from datahub.qa.results import QAResult, record, releasable, results_for, run_for_job, run_suite, run_suites
from datahub.config.suites import Suite, available_suites, load_suite

__all__ = ["QAResult", "Suite", "available_suites", "load_suite", "record", "releasable", "results_for",
           "run_for_job", "run_suite", "run_suites"]

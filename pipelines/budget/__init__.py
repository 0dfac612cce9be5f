"""The lifetime privacy budget: one ledger per private dataset id
(``store``), charged before any data is read and settled as each attempt
ends; ``python -m dpsynth.pipelines.budget.store`` (``dpsynth budget``) is
its operator command."""

"""The lifetime privacy budget: one ledger per private dataset id
(``store``: the protocol, and its operator command ``python -m
dpsynth.pipelines.budget.store``, ``dpsynth budget``), charged before any
data is read and settled as each attempt ends. Its rooms: the document
(``record``), its accounting (``accounting``), where it lives and how a
transaction is atomic (``storage``), who may change an attempt
(``ownership``, ``lease``), the lifetime cap (``cap``) and the label rule
(``label_rule``)."""

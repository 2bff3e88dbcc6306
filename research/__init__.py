"""Research code outside the installed package: studies that measured the design and the results
they wrote. It imports the installed ``ksemstamp`` package; nothing in ``ksemstamp`` imports it."""

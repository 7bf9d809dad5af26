"""The statistics behind the report's verdicts, one module per section of docs/statistics.md, in its order:

- matching: what is compared ("What is compared"): matched arms, an arm's replicates pooled into one side, two
  intervals apart or not;
- noise: the noise an interval counts ("The noise it counts"): pretraining replicates' covariance per stratum,
  the widened prior where a stratum has none;
- effects: an effect as a contrast of cells, its estimate, standard error and degrees of freedom;
- rules: the decision rule ("The rule"): two-sided tests at 5%, Holm's adjustment, a finding's verdict;
- best_ratio: "No ratio is best everywhere", as a test with a stated error rate;
- findings: the paper's five findings, each judged with the modules above;
- control: "Pretrained against the untrained control";
- power: "Power: the smallest effect a plan resolves";
- prediction: "Predicting a larger size";
- staging: "Staging by size", which of a size's arms to launch.

Pure numpy and pandas. The report (raybiphase.results.report) prints what these decide; the tables and sections it
prints them in are raybiphase.results' own.
"""

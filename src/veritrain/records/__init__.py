"""The records layer: the run record (`record`: schema and reading; `recorder`: its one writer; `journal`: the amend
transaction), the workspace, the run index (`registry`), experiments.md, the code a run imported (`usercode`)
where smoke results are filed and the verdicts kept of verify, audit and check (`verdicts`)."""

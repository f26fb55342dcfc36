"""Resolution: site + experiment -> one frozen JobPlan with every cross-check (`resolve`),
and the memory planner behind `glaunch plan` and `strategy.name: auto`. Pure."""

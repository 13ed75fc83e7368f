"""The release path: which model version serves, and taking it back when it is worse.

A finished training job becomes a candidate (`actions.Deployer`: register, start, step,
promote, roll back, pause, resume; every move checked and recorded), is validated
(`validation`: benchmark episodes through the serving engine, safety prompts), rolled out
as a canary or blue/green (`controller`, one per lineage in `fleet`), watched by `monitor`
(anytime-valid `sequential` tests on errors and rewards per session) and promoted or rolled
back. `lineage` keeps one public model name per agent; `serving_manager` keeps each
gateway's split in step with the registry; `service.serve` runs all of it with the gateway in
one process (`agentrl up`, `agentrl deploy serve`); `api` and `cli` are its human controls.

It stands on `agentrl.serving` (gateway, engines, registry, DeploySettings) and nothing above
it. Import the parts you need (`agentrl.release.actions`, `agentrl.release.service`, ...).
"""

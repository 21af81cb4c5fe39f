"""The embedded local cloud behind `berth local up`.

moto plays AWS; this package adds what moto lacks for Berth to run on one machine: each Lambda
function runs in worker processes of its own (`lambda_runtime`), the CDK template is deployed through
moto's CloudFormation with a documented list of fixes (`cloudformation_deploy`), and a SigV4-checking
front door serves the REST API (`front_door`). `cloud.LocalCloud` wires them together; `cli` exposes
`berth local up`.
"""

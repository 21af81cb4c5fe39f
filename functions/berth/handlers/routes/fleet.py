"""The fleet: capacity, on-prem hosts (drain, admission, a GPU's fault cleared) and cloud circuits."""

from typing import Annotated, Any

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from berth.domain.fleet import HOST_ID_RE
from berth.handlers import schemas, services
from berth.logic.circuits import INSTANCE_TYPE_RE, REGION_RE
from berth.logic.gpu_faults import clear_gpu_fault

router = Router()

HostId = Annotated[str, Path(pattern=HOST_ID_RE, description="On-prem host id")]
GpuRef = Annotated[
    str,
    Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,95}$", description="A GPU's UUID or its index on the host"),
]
Region = Annotated[str, Path(pattern=REGION_RE.pattern, description="An AWS region, e.g. us-east-1")]


@router.get(
    "/v1/capacity",
    summary="The fleet now: pools, hosts, free and used GPUs; cloud regions and circuit state",
    responses={200: {"description": "Capacity"}, **schemas.error_responses(403, 429)},
    tags=["fleet and policy"],
)
def capacity() -> schemas.CapacityOut:
    return schemas.CapacityOut.model_validate(
        services.fleet().capacity(services.caller(router.current_event))
    )


@router.put(
    "/v1/hosts/<host>/drain",
    summary="Drain an on-prem host, or lift its drain (admins only): nothing more is placed there and "
    "its agent stops taking work while its running jobs finish",
    responses={
        200: {"description": "The host's drain request"},
        **schemas.error_responses(400, 403, 404, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_host_drain(
    host: HostId,
    body: Annotated[
        dict[str, Any],
        Body(embed=False, description='{"drain": true} or {"drain": false}', examples=[{"drain": True}]),
    ],
) -> schemas.DrainOut:
    caller = services.caller(router.current_event)
    return schemas.DrainOut.model_validate(services.fleet().drain(caller, host, body))


@router.post(
    "/v1/hosts/<host>/gpus/<gpu>/clear",
    summary="Clear a GPU's fault (admins only): the GPU is placed on again (docs/agent.md, GPU health)",
    responses={200: {"description": "The fault cleared"}, **schemas.error_responses(403, 404, 409, 422, 429)},
    tags=["fleet and policy"],
)
def post_gpu_clear(host: HostId, gpu: GpuRef) -> schemas.GpuClearOut:
    fleet = services.fleet()
    answer = clear_gpu_fault(services.caller(router.current_event), fleet.source.hosts, host, gpu)
    fleet.clear_cache()
    return schemas.GpuClearOut.model_validate(answer)


@router.put(
    "/v1/hosts/<host>/admission",
    summary="Admit what an on-prem host may register at most (admins only): its GPU type and count. "
    "Its first registration fixes them; more, or another type, is refused until an admin admits it",
    responses={
        200: {"description": "The host's admission"},
        **schemas.error_responses(400, 403, 404, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_host_admission(
    host: HostId,
    body: Annotated[
        dict[str, Any],
        Body(
            embed=False,
            description='{"gpu_type": "H200", "gpus": 8}',
            examples=[{"gpu_type": "H200", "gpus": 8}],
        ),
    ],
) -> schemas.AdmitOut:
    caller = services.caller(router.current_event)
    return schemas.AdmitOut.model_validate(services.fleet().admit(caller, host, body))


@router.get(
    "/v1/circuits",
    summary="The cloud's circuits (admins only): each (region, instance type or `*`) with a record, "
    "its state, recent failures and last success",
    responses={200: {"description": "The circuits"}, **schemas.error_responses(403, 429)},
    tags=["fleet and policy"],
)
def get_circuits() -> schemas.CircuitsOut:
    return schemas.CircuitsOut.model_validate(services.circuits().show(services.caller(router.current_event)))


@router.delete(
    "/v1/circuits/<region>",
    summary="Reset (close) a region's circuits, or one of them with `instance_type` (admins only): "
    "their failures are forgotten and the next pass places there again",
    responses={200: {"description": "The circuits reset"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["fleet and policy"],
)
def delete_circuits(
    region: Region,
    instance_type: Annotated[
        str | None,
        Query(
            pattern=INSTANCE_TYPE_RE.pattern,
            description="Only this instance type's circuit (`*`: the region's API circuit); default: all",
        ),
    ] = None,
) -> schemas.CircuitResetOut:
    caller = services.caller(router.current_event)
    return schemas.CircuitResetOut.model_validate(services.circuits().reset(caller, region, instance_type))

// The tasks of slimkv eval (docs/eval.md says what each measures and how it is scored). Each runs
// every subject of the context on the same inputs and adds its rows to context.results.
#pragma once

#include "slimkv/evaluation.h"

namespace slimkv {

Status run_ppl_task(EvalContext& context);
Status run_passkey_task(EvalContext& context);
Status run_kvret_task(EvalContext& context);
Status run_fidelity_task(EvalContext& context);
Status run_memory_task(EvalContext& context);
Status run_speed_task(EvalContext& context);

}  // namespace slimkv

// Pipeline-parallel training over baton's RPC, both roles: stage workers
// serve their model chunks (StageServer, pipeline/stage_server.h), one
// driver runs the training steps (Pipeline, pipeline/driver.h). A program
// that plays one role may include (and link, //pipeline:stage_server or
// //pipeline:driver) that role's header only; this one includes both.
//
//   // Every process builds the same seeded model:
//   torch::nn::Sequential MakeModel() { torch::manual_seed(0); return ...; }
//
//   // Stage workers ("stage0".."stage{p-1}"):
//   auto server = pipeline::StageServer::Create(*registry, {MakeModel});
//   ... create the agent with `registry` ...
//   server->WaitForFinish(job_timeout);
//
//   // The driver:
//   auto pipe = pipeline::Pipeline::Create(*agent, options);
//   auto r = (*pipe)->Step(x, y);            // r->loss, r->bubble, r->events
//   (*pipe)->Finish();
//
// How a step runs. The driver sends each stage worker one run_step call:
// the batch's inputs to the worker of stage 0, the targets to the worker of
// the last stage, nothing else. Each worker executes its action list
// (pipeline/stage.h, guarantees PP1-PP8) on its own stage thread; activations
// and gradients go from stage to stage as baton.pipeline.deliver calls,
// never through the driver. The last stage computes the loss. Each worker
// steps its own optimizers after its last action, and the replies carry the
// losses and the timeline. The functions and their typed messages are in
// pipeline/internal/functions.h.
//
// Contract: that of the two headers; the guarantees PL1-PL4 are in
// pipeline/driver.h, PL5 in pipeline/stage_server.h.
//
// Thread-safety: a Pipeline is used by one thread; a StageServer serves
// concurrent calls (see each header).
#ifndef BATON_PIPELINE_PIPELINE_H_
#define BATON_PIPELINE_PIPELINE_H_

#include "pipeline/driver.h"        // IWYU pragma: export
#include "pipeline/stage_server.h"  // IWYU pragma: export

#endif  // BATON_PIPELINE_PIPELINE_H_

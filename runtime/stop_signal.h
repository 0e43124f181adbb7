// SIGTERM and SIGINT ask a training run to stop at the next step boundary: every rank learns of
// it through the step's one all-reduce, so all stop after the same step, whose checkpoint is
// saved when checkpointing is on (Trainer::step). LibTorch-free.
#pragma once

namespace loom::runtime {

// Installs handlers for SIGTERM and SIGINT that record the signal; a second one ends the process
// as the signal's default action would (a run that does not reach a step boundary can be
// stopped).
void install_stop_handlers();
// The signal that asked this process to stop, or 0.
int stop_signal();
// Records `signal` as the one that asked to stop (0: none), for an embedding program with its
// own handlers, and for tests.
void set_stop_signal(int signal);

}  // namespace loom::runtime

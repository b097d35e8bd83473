/* Marks around the measured part of bench/instructions.py's run under callgrind, which starts with
 * its instrumentation off (--instr-atstart=no): Python cannot issue valgrind's client requests
 * itself, so it calls these through ctypes. Built by bench/instructions.py with gcc; the header
 * comes with Debian's valgrind package. */
#include <valgrind/callgrind.h>

void orderly_measure_start(void) {
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
}

void orderly_measure_stop(void) {
    CALLGRIND_DUMP_STATS_AT("measured");
    CALLGRIND_STOP_INSTRUMENTATION;
}

/* cudadep: a library linked against the driver, as a vendor plugin or a
 * wrapper library is: a dlsym on its handle finds the driver's functions
 * among its dependencies. */
#include <spillway/cuda.h>

int cudadep_init(void)
{
    return cuInit(0);
}

#include "CLinuxShims.h"

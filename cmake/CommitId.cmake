# Writes OUTPUT, a header that defines MEGANEURA_COMMIT as SOURCE_DIR's HEAD (empty where the
# source is not a git tree), and rewrites it only when the commit changed: run records name the
# commit a binary was built from, and an unchanged commit rebuilds nothing.
execute_process(COMMAND git -C ${SOURCE_DIR} rev-parse --short=12 HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(text "#pragma once\n#define MEGANEURA_COMMIT \"${commit}\"\n")
set(previous "")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} previous)
endif()
if(NOT previous STREQUAL text)
  file(WRITE ${OUTPUT} "${text}")
endif()

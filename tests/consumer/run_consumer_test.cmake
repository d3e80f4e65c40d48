# ctest driver: install embrope into a scratch prefix, then build and run the consumer
# against it with find_package, and check the pkg-config file.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install "${EMBROPE_BUILD_DIR}" --prefix "${prefix}")
run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix};${PREFIX_PATH}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_C_COMPILER=${C_COMPILER})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
run("${WORK_DIR}/build/consumer_c")

file(GLOB_RECURSE pc_files "${prefix}/*/embrope.pc")
list(LENGTH pc_files count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "expected one installed embrope.pc, found: ${pc_files}")
endif()
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  get_filename_component(pc_dir "${pc_files}" DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
  run(${PKG_CONFIG} --libs --cflags embrope)
  if(NOT last_output MATCHES "-lembrope" OR NOT last_output MATCHES "-I")
    message(FATAL_ERROR "pkg-config gave: ${last_output}")
  endif()
  file(REAL_PATH "${prefix}/include" want_include)
  string(REGEX MATCH "-I[^ \n]+" include_flag "${last_output}")
  string(SUBSTRING "${include_flag}" 2 -1 include_dir)
  file(REAL_PATH "${include_dir}" include_dir)
  if(NOT include_dir STREQUAL want_include)
    message(FATAL_ERROR "pkg-config include dir ${include_dir} is not ${want_include}")
  endif()
  # embrope.h includes <dlpack/dlpack.h>: the C consumer compiles and links with nothing but
  # what pkg-config says.
  run(${PKG_CONFIG} --cflags embrope)
  separate_arguments(cflags UNIX_COMMAND "${last_output}")
  run(${PKG_CONFIG} --libs embrope)
  separate_arguments(libs UNIX_COMMAND "${last_output}")
  run(${C_COMPILER} ${cflags} "${CONSUMER_SOURCE_DIR}/consumer.c" ${libs}
      -o "${WORK_DIR}/consumer_pkg_config")
endif()
message("consumer: ok")

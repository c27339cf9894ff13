# dtrain_add_plugin(NAME SOURCES src... [LIBS lib...])
#
# Builds plugin NAME as the module dtrain_NAME.so with hidden visibility, so
# the only exported symbol is its entry (DT_PLUGIN_ENTRY).  The module goes
# to the shared build plugin folder (so `dtrain` finds it in the build tree)
# and installs to lib/dtrain/plugins.
function(dtrain_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  set(tgt plugin_${name})
  add_library(${tgt} MODULE ${P_SOURCES})
  set_target_properties(${tgt} PROPERTIES
    OUTPUT_NAME "dtrain_${name}" PREFIX ""
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY "${DTRAIN_PLUGIN_BUILD_DIR}")
  target_include_directories(${tgt} PRIVATE "${PROJECT_SOURCE_DIR}/sdk/include")
  target_link_libraries(${tgt} PRIVATE ${P_LIBS})
  target_link_options(${tgt} PRIVATE -Wl,--no-undefined)
  install(TARGETS ${tgt} LIBRARY DESTINATION "${DTRAIN_PLUGIN_INSTALL_DIR}")
endfunction()
